package nft

// What the external tests of package nft (package nft_test, which may
// import nftfake and nfttest) need of its insides.
var (
	EditorSets  = editorSets
	SvcFragment = svcFragment
)

// SharedCount is the number of elements ed holds for more than one owner.
func SharedCount(ed *Editor) int { return len(ed.shared) }
