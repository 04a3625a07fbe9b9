package conformance

import "testing"

func TestParseLoad(t *testing.T) {
	out := `ready held=20 at=1
fail outcome=refused at=2
fail outcome=timeout at=3
fail outcome=refused at=4
broken conn=3 err=reset at=5
summary attempted=6000 answered=5997 failed=3 held=20 broken=1 at=6
`
	s, err := ParseLoad(out)
	if err != nil {
		t.Fatal(err)
	}
	if s.Attempted != 6000 || s.Answered != 5997 || s.Failed != 3 || s.Held != 20 || s.Broken != 1 || s.Survived() != 19 ||
		s.Failures["refused"] != 2 || s.Failures["timeout"] != 1 {
		t.Errorf("ParseLoad = %+v", s)
	}
	if _, err := ParseLoad("ready held=20 at=1\n"); err == nil {
		t.Error("output without a summary was accepted")
	}
	if _, err := ParseLoad("summary attempted=x\n"); err == nil {
		t.Error("a broken summary was accepted")
	}
}
