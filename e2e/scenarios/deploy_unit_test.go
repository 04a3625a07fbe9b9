package scenarios

import (
	"slices"
	"testing"
)

// TestExpandVars checks kubelet's rules for $(VAR) in a container's
// command, which TestDeploy relies on to run the DaemonSet's command line.
func TestExpandVars(t *testing.T) {
	env := [][2]string{{"NODE_NAME", "n1"}, {"NODE_IP", "10.10.0.11"}, {"EMPTY", ""}}
	for _, tc := range []struct{ in, want string }{
		{"--hostname-override=$(NODE_NAME)", "--hostname-override=n1"},
		{"--metrics-bind-address-override=$(NODE_IP)", "--metrics-bind-address-override=10.10.0.11"},
		{"$(NODE_NAME)/$(NODE_IP)", "n1/10.10.0.11"},
		{"$(UNDEFINED)", "$(UNDEFINED)"},
		{"$$(NODE_NAME)", "$(NODE_NAME)"},
		{"$(EMPTY)x", "x"},
		{"$(NODE_NAME", "$(NODE_NAME"},
		{"a$b", "a$b"},
		{"$", "$"},
	} {
		if got := expandVars([]string{tc.in}, env); !slices.Equal(got, []string{tc.want}) {
			t.Errorf("expandVars(%q) = %q, want %q", tc.in, got[0], tc.want)
		}
	}
}
