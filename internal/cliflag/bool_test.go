package cliflag

import (
	"testing"
)

// TestBoolAndTruthy pins the two boolean Values that share one type: Bool
// refuses text it does not know, Truthy takes only 1/true/yes as true and
// never fails; both are switches on the command line, with --no- forms.
func TestBoolAndTruthy(t *testing.T) {
	for _, c := range []struct {
		in           string
		bool, truthy bool
		boolErr      string
	}{
		{"1", true, true, ""},
		{"TRUE", true, true, ""},
		{" yes ", true, true, ""},
		{"on", true, false, ""},
		{"", true, false, ""},
		{"0", false, false, ""},
		{"off", false, false, ""},
		{"No", false, false, ""},
		{"maybe", false, false, `not a boolean (got "maybe")`},
	} {
		b, tr := !c.bool, !c.truthy // start opposite, so Set must write
		bv, tv := Bool(&b), Truthy(&tr)
		err := bv.Set(c.in)
		if c.boolErr != "" {
			if err == nil || err.Error() != c.boolErr || b != !c.bool {
				t.Errorf("Bool.Set(%q): err %v value %v, want error %q and no change", c.in, err, b, c.boolErr)
			}
		} else if err != nil || b != c.bool || bv.String() != map[bool]string{true: "true", false: "false"}[c.bool] {
			t.Errorf("Bool.Set(%q): err %v value %v String %q, want %v", c.in, err, b, bv.String(), c.bool)
		}
		if err := tv.Set(c.in); err != nil || tr != c.truthy {
			t.Errorf("Truthy.Set(%q): err %v value %v, want %v", c.in, err, tr, c.truthy)
		}
	}
	for _, c := range []struct {
		args []string
		want bool
	}{
		{[]string{"--b", "--t"}, true},
		{[]string{"--b=true", "--t=yes"}, true},
		{[]string{"--no-b", "--no-t"}, false},
	} {
		var b, tr bool
		if len(c.args) > 0 && c.args[0] == "--no-b" {
			b, tr = true, true
		}
		s := New("test")
		s.Add(&Entry{Name: "b", Value: Bool(&b), Negatable: true})
		s.Add(&Entry{Name: "t", Value: Truthy(&tr), Negatable: true})
		if err := s.Parse(c.args, env(nil)); err != nil || b != c.want || tr != c.want {
			t.Errorf("%v: err %v b %v t %v, want %v", c.args, err, b, tr, c.want)
		}
	}
	var tr bool
	s := New("test")
	s.Add(&Entry{Name: "t", Env: "T", Value: Truthy(&tr)})
	if err := s.Parse(nil, env(map[string]string{"T": "on"})); err != nil || tr {
		t.Errorf("T=on: err %v value %v, want false and no error", err, tr)
	}
}
