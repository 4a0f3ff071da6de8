// Package tag will hold member tags and tag expressions (github.com/expr-lang/expr) evaluated
// at the edge; not built yet: until it is, sends with a tag expression are refused.
package tag
