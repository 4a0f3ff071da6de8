package tag

import (
	"fmt"
	"testing"
)

// BenchmarkCompile: what a tag expression costs the first time a process sees it, in the
// form most targeted messages take (scanAnyOf).
func BenchmarkCompile(b *testing.B) {
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := Compile(fmt.Sprintf(`"c:%d" in tags || "c:%d" in tags || "g:%d" in tags`, i%10, (i+3)%10, i%500)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCompileProgram: the same for an expression that needs the compiler.
func BenchmarkCompileProgram(b *testing.B) {
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := Compile(fmt.Sprintf(`"c:%d" in tags && !("g:%d" in tags)`, i%10, i%500)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEvalCached: an expression's value for a tag set it has seen.
func BenchmarkEvalCached(b *testing.B) {
	e, _ := Compile(`"c:3" in tags || "g:17" in tags`)
	s := NewInterner().Intern([]string{"c:3", "g:42"})
	e.Eval(s, "u")
	b.ReportAllocs()
	for b.Loop() {
		e.Eval(s, "u")
	}
}
