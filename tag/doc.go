// Package tag holds member tags and tag expressions. A member carries a set of tags (from its
// login token or set later by the app server); a message may carry an expression over the
// receiving member's tags, and only members for whom it is true receive the message.
//
// Expressions use github.com/expr-lang/expr, restricted to a small, bounded language: the
// identifiers tags, role and uid; string, bool and list literals; the operators in, not, !,
// &&, ||, and, or, ==, !=, startsWith, endsWith, contains and parentheses. No functions, no
// ranges, no loops: evaluating one costs at most its node count times the member's tag count.
// See docs/tags.md.
//
// The package knows nothing of rooms or connections: the ChatLink groups members by identical
// tag set (Set, interned) and evaluates each expression once per group.
package tag
