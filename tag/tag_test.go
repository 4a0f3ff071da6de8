package tag

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestExpressions(t *testing.T) {
	in := NewInterner()
	student3 := in.Intern([]string{"class:3", "role:student"})
	assistant3 := in.Intern([]string{"role:assistant", "class:3"})
	student1 := in.Intern([]string{"class:1", "role:student", "class:1"})
	lecturer := in.Intern([]string{"role:lecturer"})
	cases := []struct {
		src  string
		want []bool // student3, assistant3, student1, lecturer
	}{
		{`"class:3" in tags`, []bool{true, true, false, false}},
		{`"class:3" in tags && !("role:assistant" in tags)`, []bool{true, false, false, false}},
		{`"class:1" in tags || "class:3" in tags`, []bool{true, true, true, false}},
		{`role == "lecturer"`, []bool{false, false, false, true}},
		{`role in ["assistant", "lecturer"]`, []bool{false, true, false, true}},
		{`not ("class:3" in tags)`, []bool{false, false, true, true}},
		{`uid startsWith "stu"`, []bool{true, false, true, false}},
		{`true`, []bool{true, true, true, true}},
	}
	uids := []string{"stu-a", "ast-b", "stu-c", "lec"}
	for _, tc := range cases {
		e, err := Compile(tc.src)
		if err != nil {
			t.Fatalf("%s: %v", tc.src, err)
		}
		for i, s := range []*Set{student3, assistant3, student1, lecturer} {
			for range 2 { // the second time from the cache
				if got := e.Eval(s, uids[i]); got != tc.want[i] {
					t.Errorf("%s for %v: %v, want %v", tc.src, s.Tags, got, tc.want[i])
				}
			}
		}
	}
	if student1.Key != "class:1,role:student" || student1.Role != "student" {
		t.Fatalf("set not canonical: %+v", student1)
	}
}

func TestRefusedExpressions(t *testing.T) {
	for _, src := range []string{
		"",
		`"class:3" in`,               // does not parse
		`len(tags) > 1`,              // a function
		`1..1000000000 | all(# > 0)`, // a range and a predicate
		`tags[0] == "a"`,             // indexing
		`foo == "a"`,                 // unknown name
		`"a" matches "b+"`,           // regular expressions
		`1 + 2 == 3`,                 // arithmetic
		`let x = tags; "a" in x`,     // variables
		`"a" in tags ? true : false`, // conditionals
		`role`,                       // not a boolean
		strings.Repeat(`"a" in tags || `, 40) + "true", // too many nodes
		`"` + strings.Repeat("x", 600) + `" in tags`,   // too long
		"\xff",
	} {
		if _, err := Compile(src); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: err %v, want ErrInvalid", src, err)
		}
	}
}

func TestCache(t *testing.T) {
	c := NewCache(2)
	a1, err := c.Get(`"a" in tags`)
	if err != nil {
		t.Fatal(err)
	}
	if a2, _ := c.Get(`"a" in tags`); a2 != a1 {
		t.Fatal("second Get compiled again")
	}
	if _, err := c.Get(`bad(`); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad expression: %v", err)
	}
	_, _ = c.Get(`"b" in tags`)
	if c.Len() != 2 {
		t.Fatalf("cache holds %d, limit 2", c.Len())
	}
	if a3, _ := c.Get(`"a" in tags`); a3 == a1 {
		t.Fatal("least recently used entry was not evicted")
	}
}

func TestInternerSharesAndForgets(t *testing.T) {
	in := NewInterner()
	a := in.Intern([]string{"x", "y"})
	b := in.Intern([]string{"y", "x", "x"})
	if a != b {
		t.Fatal("same tags, different sets")
	}
	in.Release(a)
	if in.Len() != 1 {
		t.Fatal("set dropped while still held")
	}
	in.Release(b)
	if in.Len() != 0 {
		t.Fatal("set kept after its last release")
	}
	if c := in.Intern([]string{"x", "y"}); c.ID == a.ID {
		t.Fatal("a forgotten set's id was reused")
	}
}

func TestValidate(t *testing.T) {
	if err := Validate([]string{"class:3", "role:student", "a.b-c_d"}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]string{{""}, {"has space"}, {strings.Repeat("x", 65)}, make([]string, 33)} {
		if err := Validate(bad); !errors.Is(err, ErrBadTags) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// FuzzCompile: no input panics, and whatever compiles evaluates quickly.
func FuzzCompile(f *testing.F) {
	for _, s := range []string{`"class:3" in tags`, `role == "x" && !("a" in tags)`, `uid startsWith "u"`, `1..9`, `len(tags)`, `[[[[`, `"a" in ["a","b"]`} {
		f.Add(s)
	}
	s := NewInterner().Intern([]string{"class:3", "role:student", "a", "b", "c"})
	f.Fuzz(func(t *testing.T, src string) {
		e, err := Compile(src)
		if err != nil {
			return
		}
		start := time.Now()
		e.Eval(s, "u1")
		if d := time.Since(start); d > 50*time.Millisecond {
			t.Fatalf("%q took %v to evaluate", src, d)
		}
	})
}

// TestAnyOf: a disjunction of tag memberships names its tags, and holding one of them is
// exactly what the expression says; any other shape names none.
func TestAnyOf(t *testing.T) {
	in := NewInterner()
	sets := []*Set{
		in.Intern(nil),
		in.Intern([]string{"c:3", "g:17"}),
		in.Intern([]string{"c:4", "g:117"}),
		in.Intern([]string{"role:teacher", "c:5"}),
	}
	cases := []struct {
		src  string
		tags []string // nil: not a disjunction of memberships
	}{
		{`"c:3" in tags`, []string{"c:3"}},
		{`"c:3" in tags || "c:5" in tags || "g:117" in tags`, []string{"c:3", "c:5", "g:117"}},
		{`("c:3" in tags or "c:5" in tags) || ("g:117" in tags)`, []string{"c:3", "c:5", "g:117"}},
		{`"c:3" in tags && "g:17" in tags`, nil},
		{`"c:3" in tags || !("g:17" in tags)`, nil},
		{`"c:3" in tags || role == "teacher"`, nil},
		{`"c:3" in tags || uid == "u"`, nil},
		{`role in ["teacher"]`, nil},
		{`true`, nil},
	}
	for _, tc := range cases {
		e, err := Compile(tc.src)
		if err != nil {
			t.Fatalf("%s: %v", tc.src, err)
		}
		got, ok := e.AnyOf()
		if ok != (tc.tags != nil) || !slices.Equal(got, tc.tags) {
			t.Errorf("%s: AnyOf = %q, %v; want %q", tc.src, got, ok, tc.tags)
			continue
		}
		for _, s := range sets {
			if !ok {
				break
			}
			holds := slices.ContainsFunc(got, func(tg string) bool { return slices.Contains(s.Tags, tg) })
			if v := e.Eval(s, "u"); v != holds {
				t.Errorf("%s for %v: Eval %v, holds one of %q: %v", tc.src, s.Tags, v, got, holds)
			}
		}
	}
}

// TestScannedAnyOfMatchesTheCompiler: the expressions scanAnyOf takes without the compiler
// mean what the compiled program means, and the near misses are left to the compiler.
func TestScannedAnyOfMatchesTheCompiler(t *testing.T) {
	t.Parallel()
	in := NewInterner()
	sets := []*Set{
		in.Intern(nil),
		in.Intern([]string{"c:3", "g:17"}),
		in.Intern([]string{"c:4", "g:117"}),
		in.Intern([]string{"role:teacher", "c:5", "a b"}),
		in.Intern([]string{"in", "tags", "||"}),
	}
	cases := []struct {
		src     string
		scanned bool
	}{
		{`"c:3" in tags`, true},
		{`"c:3" in tags || "c:5" in tags || "g:117" in tags`, true},
		{`"c:3" in tags or "g:117" in tags`, true},
		{"\t\"c:4\"in tags||\"a b\" in\ntags ", true},
		{`"in" in tags || "||" in tags`, true},
		{`"" in tags`, true},
		{strings.TrimSuffix(strings.Repeat(`"a" in tags || `, 16), " || "), true},  // 63 nodes
		{strings.TrimSuffix(strings.Repeat(`"a" in tags || `, 17), " || "), false}, // 67: refused
		{`("c:3" in tags) || "c:5" in tags`, false},
		{`"c:3" in tags && "g:17" in tags`, false},
		{`"c:3" in tags || role == "teacher"`, false},
		{`"c:\x33" in tags`, false},
		{`'c:3' in tags`, false},
		{`"c:3" in tagsx`, false},
		{`"c:3" intags`, false},
		{`"c:3" in tags ||`, false},
		{`"c:3" in tags || || "c:5" in tags`, false},
		{`"c:3" in tags orr "c:5" in tags`, false},
		{`"c:3" not in tags`, false},
		{"\"c:\n3\" in tags", false},
	}
	for _, tc := range cases {
		if _, ok := scanAnyOf(tc.src); ok != tc.scanned {
			t.Errorf("%q: scanned %v, want %v", tc.src, ok, tc.scanned)
		}
		e, err := Compile(tc.src)
		want, werr := compileProgram(tc.src)
		if (err == nil) != (werr == nil) {
			t.Errorf("%q: Compile err %v, the compiler's %v", tc.src, err, werr)
			continue
		}
		if err != nil {
			continue
		}
		if got, wantTags := fmtAnyOf(e), fmtAnyOf(want); got != wantTags {
			t.Errorf("%q: AnyOf %s, the compiler's %s", tc.src, got, wantTags)
		}
		for _, s := range sets {
			if got, w := e.Eval(s, "u"), want.Eval(s, "u"); got != w {
				t.Errorf("%q for %q: %v, the compiler's %v", tc.src, s.Tags, got, w)
			}
			if got, w := e.EvalTags(s.Tags, "u"), want.EvalTags(s.Tags, "u"); got != w {
				t.Errorf("%q for %q: EvalTags %v, the compiler's %v", tc.src, s.Tags, got, w)
			}
		}
	}
}

func fmtAnyOf(e *Expr) string {
	tags, ok := e.AnyOf()
	if !ok {
		return "none"
	}
	return strings.Join(tags, "|")
}
