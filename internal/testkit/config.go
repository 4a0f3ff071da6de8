package testkit

import (
	"strings"
	"testing"
)

// ConfigCase is one row of a table test of a component's Config.withDefaults.
type ConfigCase[C any] struct {
	Name   string
	Config C
	// Check looks at the filled Config when withDefaults succeeds. Nil means no look.
	Check func(t *testing.T, filled C)
	// WantErr is a substring of the error withDefaults must return. Empty means it must
	// succeed.
	WantErr string
}

// RunConfigCases runs each case as a subtest: withDefaults (a method expression such as
// Config.withDefaults) must fail as the case says, or succeed and pass its Check.
func RunConfigCases[C any](t *testing.T, withDefaults func(C) (C, error), cases []ConfigCase[C]) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			filled, err := withDefaults(tc.Config)
			switch {
			case tc.WantErr == "" && err != nil:
				t.Fatalf("withDefaults: %v", err)
			case tc.WantErr != "" && err == nil:
				t.Fatalf("withDefaults accepted it; want an error saying %q", tc.WantErr)
			case tc.WantErr != "" && !strings.Contains(err.Error(), tc.WantErr):
				t.Fatalf("withDefaults: %q, want an error saying %q", err, tc.WantErr)
			}
			if err == nil && tc.Check != nil {
				tc.Check(t, filled)
			}
		})
	}
}
