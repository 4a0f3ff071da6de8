package tag

import (
	"container/list"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/parser"
	"github.com/expr-lang/expr/vm"
)

// Limits on an expression.
const (
	MaxExprBytes = 512
	MaxExprNodes = 64
)

// ErrInvalid wraps every reason an expression is refused.
var ErrInvalid = errors.New("tag: invalid expression")

// Env is what an expression sees of the receiving member.
type Env struct {
	Tags []string `expr:"tags"`
	// Role is the value of the member's "role:" tag, or "".
	Role string `expr:"role"`
	UID  string `expr:"uid"`
}

// Expr is a compiled, validated tag expression.
type Expr struct {
	src     string
	prog    *vm.Program
	usesUID bool
	anyOf   []string // the expression is true exactly for sets holding one of these; nil when not of that form

	mu      sync.Mutex      // guards results
	results map[uint64]bool // by Set.ID: the expression's value for that set
}

// String returns the expression's source.
func (e *Expr) String() string { return e.src }

// UsesUID reports whether the expression reads uid: then it must be evaluated per member, not
// once per tag set.
func (e *Expr) UsesUID() bool { return e.usesUID }

var allowedBinary = map[string]bool{
	"&&": true, "||": true, "and": true, "or": true, "==": true, "!=": true, "in": true,
	"startsWith": true, "endsWith": true, "contains": true,
}

var allowedIdent = map[string]bool{"tags": true, "role": true, "uid": true}

// checker walks a parsed expression and records the first construct outside the language.
type checker struct {
	err     error
	nodes   int
	usesUID bool
}

func (c *checker) Visit(node *ast.Node) {
	c.nodes++
	if c.err != nil {
		return
	}
	switch n := (*node).(type) {
	case *ast.StringNode, *ast.BoolNode, *ast.ArrayNode, *ast.ConstantNode:
	case *ast.IdentifierNode:
		if !allowedIdent[n.Value] {
			c.err = fmt.Errorf("unknown name %q (use tags, role or uid)", n.Value)
		}
		c.usesUID = c.usesUID || n.Value == "uid"
	case *ast.UnaryNode:
		if n.Operator != "!" && n.Operator != "not" {
			c.err = fmt.Errorf("operator %q is not allowed", n.Operator)
		}
	case *ast.BinaryNode:
		if !allowedBinary[n.Operator] {
			c.err = fmt.Errorf("operator %q is not allowed", n.Operator)
		}
	default:
		c.err = fmt.Errorf("%T is not allowed: only names, strings, lists and boolean operators", n)
	}
}

// Compile validates src and compiles it. The error wraps ErrInvalid and says what is wrong.
func Compile(src string) (*Expr, error) {
	switch {
	case src == "":
		return nil, fmt.Errorf("%w: empty", ErrInvalid)
	case len(src) > MaxExprBytes:
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d", ErrInvalid, len(src), MaxExprBytes)
	case !utf8.ValidString(src):
		return nil, fmt.Errorf("%w: not valid UTF-8", ErrInvalid)
	}
	if tags, ok := scanAnyOf(src); ok {
		// The common form of a targeted message, answered without a program: compiling one
		// costs about 100 µs, paid by every process that sees a new expression (the server
		// API, the room service and each ChatLink).
		return &Expr{src: src, anyOf: tags, results: make(map[uint64]bool)}, nil
	}
	return compileProgram(src)
}

// compileProgram parses, checks and compiles src into a program of the expression language.
func compileProgram(src string) (*Expr, error) {
	tree, err := parser.Parse(src)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	var c checker
	ast.Walk(&tree.Node, &c)
	switch {
	case c.err != nil:
		return nil, fmt.Errorf("%w: %v", ErrInvalid, c.err)
	case c.nodes > MaxExprNodes:
		return nil, fmt.Errorf("%w: %d nodes, the limit is %d", ErrInvalid, c.nodes, MaxExprNodes)
	}
	prog, err := expr.Compile(src, expr.Env(Env{}), expr.AsBool(), expr.DisableAllBuiltins(), expr.MaxNodes(MaxExprNodes))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return &Expr{src: src, prog: prog, usesUID: c.usesUID, anyOf: anyOf(tree.Node), results: make(map[uint64]bool)}, nil
}

// AnyOf returns the tags t1, ..., tn when the expression is `"t1" in tags || ... || "tn" in
// tags` (in any grouping, with or as well as ||): it is true exactly for the members holding one
// of them. A fan-out can then find a message's audience by the members' tags, without
// evaluating it per tag set. ok is false for any other expression.
func (e *Expr) AnyOf() (tags []string, ok bool) { return e.anyOf, e.anyOf != nil }

// anyOf returns the tags of a disjunction of `"t" in tags`, or nil.
func anyOf(node ast.Node) []string {
	switch n := node.(type) {
	case *ast.BinaryNode:
		switch n.Operator {
		case "||", "or":
			left, right := anyOf(n.Left), anyOf(n.Right)
			if left == nil || right == nil {
				return nil
			}
			return append(left, right...)
		case "in":
			lit, ok := n.Left.(*ast.StringNode)
			if id, isIdent := n.Right.(*ast.IdentifierNode); ok && isIdent && id.Value == "tags" {
				return []string{lit.Value}
			}
		}
	}
	return nil
}

// scanAnyOf recognises, without the expression compiler, the plainest form of AnyOf's
// expressions: `"t1" in tags || "t2" in tags ...` (|| or "or", any spacing, no parentheses, no
// escapes in the strings, within MaxExprNodes), and returns its tags. Anything else, valid or
// not, is false and goes through the parser and the compiler. It reads the tokens as the
// compiler's lexer does: a string is the text between two double quotes, a word a run of
// letters, digits and underscores, so `"a"in tags` is accepted and `"a" intags` is not.
func scanAnyOf(src string) ([]string, bool) {
	var tags []string
	i := 0
	skipSpace := func() {
		for i < len(src) && (src[i] == ' ' || src[i] == '\t' || src[i] == '\n' || src[i] == '\r') {
			i++
		}
	}
	word := func() string {
		start := i
		for i < len(src) && (src[i] == '_' || src[i] >= 'a' && src[i] <= 'z' || src[i] >= 'A' && src[i] <= 'Z' || src[i] >= '0' && src[i] <= '9') {
			i++
		}
		return src[start:i]
	}
	for {
		skipSpace()
		if i == len(src) || src[i] != '"' {
			return nil, false
		}
		end := strings.IndexByte(src[i+1:], '"')
		if end < 0 || strings.ContainsFunc(src[i+1:i+1+end], func(r rune) bool { return r == '\\' || r < ' ' }) {
			return nil, false // escapes and control characters are the lexer's to judge
		}
		tags = append(tags, src[i+1:i+1+end])
		i += end + 2
		skipSpace()
		if word() != "in" {
			return nil, false
		}
		skipSpace()
		if word() != "tags" {
			return nil, false
		}
		skipSpace()
		switch {
		case i == len(src):
			// Each membership is three nodes (the test, the string and tags), each || one.
			if 4*len(tags)-1 > MaxExprNodes {
				return nil, false
			}
			return tags, true
		case strings.HasPrefix(src[i:], "||"):
			i += 2
		case word() != "or":
			return nil, false
		}
	}
}

// Eval evaluates the expression for a member with tag set s and uid. Unless the expression
// uses uid, the result is cached per set.
func (e *Expr) Eval(s *Set, uid string) bool {
	if !e.usesUID {
		e.mu.Lock()
		v, ok := e.results[s.ID]
		e.mu.Unlock()
		if ok {
			return v
		}
	}
	// A compiled boolean expression over strings cannot fail; if it did, it delivers nothing.
	v := e.run(Env{Tags: s.Tags, Role: s.Role, UID: uid})
	if !e.usesUID {
		e.mu.Lock()
		if len(e.results) >= maxCachedResults {
			clear(e.results)
		}
		e.results[s.ID] = v
		e.mu.Unlock()
	}
	return v
}

// EvalTags evaluates the expression for a member with the given tags and uid, without caching:
// for one-off checks such as a sender's permission.
func (e *Expr) EvalTags(tags []string, uid string) bool {
	return e.run(Env{Tags: tags, Role: roleOf(tags), UID: uid})
}

func (e *Expr) run(env Env) bool {
	if e.prog == nil { // scanAnyOf's form: true when the member holds one of the tags
		return slices.ContainsFunc(e.anyOf, func(t string) bool { return slices.Contains(env.Tags, t) })
	}
	out, err := expr.Run(e.prog, env)
	v, _ := out.(bool)
	return err == nil && v
}

// maxCachedResults bounds one expression's result cache; it starts over when full.
const maxCachedResults = 4096

// Cache compiles expressions once and keeps the most recently used ones. Refusals are cached
// too, so a client repeating a bad expression costs a map lookup.
type Cache struct {
	size int

	mu    sync.Mutex // guards the fields below
	lru   *list.List // of *cacheEntry, most recent first
	byKey map[string]*list.Element
}

type cacheEntry struct {
	src string
	e   *Expr
	err error
}

// NewCache returns a cache of at most size expressions (at least 1).
func NewCache(size int) *Cache {
	return &Cache{size: max(1, size), lru: list.New(), byKey: make(map[string]*list.Element)}
}

// Get returns the compiled expression for src, compiling it on a miss.
func (c *Cache) Get(src string) (*Expr, error) {
	c.mu.Lock()
	if el, ok := c.byKey[src]; ok {
		c.lru.MoveToFront(el)
		ent := el.Value.(*cacheEntry)
		c.mu.Unlock()
		return ent.e, ent.err
	}
	c.mu.Unlock()
	e, err := Compile(src)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byKey[src]; !ok {
		c.byKey[src] = c.lru.PushFront(&cacheEntry{src: src, e: e, err: err})
		for c.lru.Len() > c.size {
			old := c.lru.Remove(c.lru.Back()).(*cacheEntry)
			delete(c.byKey, old.src)
		}
	}
	return e, err
}

// Len returns the number of cached expressions.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}
