package watch

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// objectMeta is the metadata of a converted value as the reflector and its
// stores read it (meta.Accessor): the object's key, its resource version
// and a bookmark's annotation. It is a metav1.Object itself, so that each
// read does not build a metav1.ObjectMeta: the reflector and the watch-list
// store read every object of a list. It has no other metadata, and no one
// writes to it: the setters do nothing.
type objectMeta struct {
	namespace, name, resourceVersion string
	initialEventsEnd                 bool // the bookmark that ends a watch's initial events
}

var _ metav1.Object = &objectMeta{}

// initialEventsEnd is a bookmark's annotations.
var initialEventsEnd = map[string]string{metav1.InitialEventsAnnotationKey: "true"}

func (m *objectMeta) GetNamespace() string       { return m.namespace }
func (m *objectMeta) GetName() string            { return m.name }
func (m *objectMeta) GetResourceVersion() string { return m.resourceVersion }

// GetAnnotations returns a map the caller must not change.
func (m *objectMeta) GetAnnotations() map[string]string {
	if m.initialEventsEnd {
		return initialEventsEnd
	}
	return nil
}

func (m *objectMeta) GetGenerateName() string                       { return "" }
func (m *objectMeta) GetUID() types.UID                             { return "" }
func (m *objectMeta) GetGeneration() int64                          { return 0 }
func (m *objectMeta) GetSelfLink() string                           { return "" }
func (m *objectMeta) GetCreationTimestamp() metav1.Time             { return metav1.Time{} }
func (m *objectMeta) GetDeletionTimestamp() *metav1.Time            { return nil }
func (m *objectMeta) GetDeletionGracePeriodSeconds() *int64         { return nil }
func (m *objectMeta) GetLabels() map[string]string                  { return nil }
func (m *objectMeta) GetFinalizers() []string                       { return nil }
func (m *objectMeta) GetOwnerReferences() []metav1.OwnerReference   { return nil }
func (m *objectMeta) GetManagedFields() []metav1.ManagedFieldsEntry { return nil }
func (m *objectMeta) SetNamespace(string)                           {}
func (m *objectMeta) SetName(string)                                {}
func (m *objectMeta) SetGenerateName(string)                        {}
func (m *objectMeta) SetUID(types.UID)                              {}
func (m *objectMeta) SetResourceVersion(string)                     {}
func (m *objectMeta) SetGeneration(int64)                           {}
func (m *objectMeta) SetSelfLink(string)                            {}
func (m *objectMeta) SetCreationTimestamp(metav1.Time)              {}
func (m *objectMeta) SetDeletionTimestamp(*metav1.Time)             {}
func (m *objectMeta) SetDeletionGracePeriodSeconds(*int64)          {}
func (m *objectMeta) SetLabels(map[string]string)                   {}
func (m *objectMeta) SetAnnotations(map[string]string)              {}
func (m *objectMeta) SetFinalizers([]string)                        {}
func (m *objectMeta) SetOwnerReferences([]metav1.OwnerReference)    {}
func (m *objectMeta) SetManagedFields([]metav1.ManagedFieldsEntry)  {}
