package dispatcher

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// interner maps label strings (country codes, ISP keys) to small integers so that scoring a
// node against a client compares integers. Id 0 means "unknown". The set of strings is bounded
// by the databases and the node labels, so it is never pruned.
type interner struct {
	mu  sync.Mutex // guards ids and names
	ids map[string]uint32
	// names[id] is the string of id; names[0] is "".
	names []string
}

func newInterner() *interner {
	return &interner{ids: make(map[string]uint32), names: []string{""}}
}

func (in *interner) id(s string) uint32 {
	if s == "" {
		return 0
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if id, ok := in.ids[s]; ok {
		return id
	}
	id := uint32(len(in.names))
	in.ids[s] = id
	in.names = append(in.names, s)
	return id
}

func (in *interner) name(id uint32) string {
	in.mu.Lock()
	defer in.mu.Unlock()
	if int(id) < len(in.names) {
		return in.names[id]
	}
	return ""
}

// region is where a client or a node is, as interned ids; 0 is unknown. The subdivision id
// interns "COUNTRY/SUBDIVISION", since subdivision codes repeat across countries.
type region struct {
	continent, country, subdivision uint32
}

// matchLevel says how near a node is to a client.
type matchLevel uint8

const (
	matchUnknown     matchLevel = iota // the client's region is unknown
	matchNone                          // different continents (or the node is unlabelled)
	matchContinent                     // same continent
	matchCountry                       // same country
	matchSubdivision                   // same subdivision (province, state)
	// With a near-region list for the client's region (Config.NearRegions), the nodes of other
	// continents are matchNear+i, the i-th region of the list, or matchFar, on none of it.
	matchFar
	matchNear
	matchLevels = matchNear + maxNear
)

// maxNear bounds a near-region list: the other continents fit, with room for a country or two.
const maxNear = 8

var matchNames = func() [matchLevels]string {
	names := [matchLevels]string{"unknown", "elsewhere", "continent", "country", "subdivision", "elsewhere"}
	for i := matchNear; i < matchLevels; i++ {
		names[i] = "near"
	}
	return names
}()

func (m matchLevel) String() string { return matchNames[m] }

// level is how near a node in region node is to the client at l: region.match, refined by the
// client's near-region list for nodes on other continents.
func (l location) level(node region) matchLevel {
	m := l.region.match(node)
	if m != matchNone || l.near == nil {
		return m
	}
	for i, r := range l.near.regions {
		if r.contains(node) {
			return matchNear + matchLevel(i)
		}
	}
	return matchFar
}

// contains says whether node is within the region prefix r (r's unset parts match anything).
func (r region) contains(node region) bool {
	return r.continent != 0 && r.continent == node.continent &&
		(r.country == 0 || r.country == node.country) &&
		(r.subdivision == 0 || r.subdivision == node.subdivision)
}

// nearList is the regions a client's region falls back to after its own continent, nearest
// first (Config.NearRegions).
type nearList struct {
	key     string // the table's key that matched, for the admin view
	regions []region
}

// nearTable is Config.NearRegions parsed: client region prefix -> its near list.
type nearTable map[region]*nearList

// newNearTable checks and parses Config.NearRegions.
func newNearTable(in *interner, table map[string][]string) (nearTable, error) {
	t := make(nearTable, len(table))
	for key, entries := range table {
		from, err := parseRegion(in, key)
		if err != nil {
			return nil, fmt.Errorf("near regions of %q: %w", key, err)
		}
		if from.continent == 0 {
			return nil, errors.New("near regions: a key must name a region")
		}
		if _, dup := t[from]; dup {
			return nil, fmt.Errorf("near regions: %q is given twice", key)
		}
		if len(entries) == 0 || len(entries) > maxNear {
			return nil, fmt.Errorf("near regions of %q: want 1 to %d regions, got %d", key, maxNear, len(entries))
		}
		l := &nearList{key: regionLabel(in, from)}
		for _, e := range entries {
			r, err := parseRegion(in, e)
			if err != nil {
				return nil, fmt.Errorf("near regions of %q: %w", key, err)
			}
			if r.continent == 0 {
				return nil, fmt.Errorf("near regions of %q: an empty region", key)
			}
			if r.continent == from.continent {
				// Nodes of the client's own continent already rank above every other
				// continent's (the continent tier); the list orders the others.
				return nil, fmt.Errorf("near regions of %q: %q is on the same continent; the list orders other continents", key, e)
			}
			if slices.Contains(l.regions, r) {
				return nil, fmt.Errorf("near regions of %q: %q is listed twice", key, e)
			}
			l.regions = append(l.regions, r)
		}
		t[from] = l
	}
	return t, nil
}

// lookup returns the near list of a client's region: the most specific key that contains it
// (subdivision, then country, then continent), or nil.
func (t nearTable) lookup(client region) *nearList {
	if len(t) == 0 || client.continent == 0 {
		return nil
	}
	if client.subdivision != 0 {
		if l := t[client]; l != nil {
			return l
		}
	}
	if client.country != 0 {
		if l := t[region{continent: client.continent, country: client.country}]; l != nil {
			return l
		}
	}
	return t[region{continent: client.continent}]
}

func (client region) match(node region) matchLevel {
	switch {
	case client.continent == 0 && client.country == 0:
		return matchUnknown
	case client.subdivision != 0 && client.subdivision == node.subdivision:
		return matchSubdivision
	case client.country != 0 && client.country == node.country:
		return matchCountry
	case client.continent != 0 && client.continent == node.continent:
		return matchContinent
	}
	return matchNone
}

var continents = map[string]bool{"AF": true, "AN": true, "AS": true, "EU": true, "NA": true, "OC": true, "SA": true}

// parseRegion reads a node's region label, "CONTINENT/COUNTRY/SUBDIVISION" with MaxMind's
// codes (e.g. "AS/CN/22") or a prefix of it ("AS/CN", "EU"). The empty label is unlabelled.
func parseRegion(in *interner, label string) (region, error) {
	if label == "" {
		return region{}, nil
	}
	parts := strings.Split(strings.ToUpper(strings.TrimSpace(label)), "/")
	if len(parts) > 3 {
		return region{}, fmt.Errorf("region %q has more than three parts (CONTINENT/COUNTRY/SUBDIVISION)", label)
	}
	if !continents[parts[0]] {
		return region{}, fmt.Errorf("region %q: %q is not a continent code (AF AN AS EU NA OC SA)", label, parts[0])
	}
	r := region{continent: in.id(parts[0])}
	if len(parts) > 1 {
		if !isCode(parts[1], 2, 2) {
			return region{}, fmt.Errorf("region %q: %q is not a two-letter country code", label, parts[1])
		}
		r.country = in.id(parts[1])
	}
	if len(parts) > 2 {
		if !isCode(parts[2], 1, 3) {
			return region{}, fmt.Errorf("region %q: %q is not a subdivision code (1-3 letters or digits)", label, parts[2])
		}
		r.subdivision = in.id(parts[1] + "/" + parts[2])
	}
	return r, nil
}

func isCode(s string, minLen, maxLen int) bool {
	if len(s) < minLen || len(s) > maxLen {
		return false
	}
	for _, c := range s {
		if (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// regionLabel is the inverse of parseRegion, for logs and the admin view.
func regionLabel(in *interner, r region) string {
	var parts []string
	if r.continent != 0 {
		parts = append(parts, in.name(r.continent))
	}
	if r.country != 0 {
		parts = append(parts, in.name(r.country))
	}
	if r.subdivision != 0 {
		sub := in.name(r.subdivision)
		parts = append(parts, sub[strings.IndexByte(sub, '/')+1:])
	}
	return strings.Join(parts, "/")
}

// DefaultISPGroups returns the ISP-equivalence table used when Config.ISPGroups is nil: the
// main Chinese carriers, each with the ASNs of its backbones and a prefix of the names the
// GeoIP2 ISP database gives its regional networks. It is a starting point; operators should
// keep their own table.
func DefaultISPGroups() map[string][]string {
	return map[string][]string{
		"telecom": {"AS4134", "AS4809", "AS23764", "China Telecom*", "Chinanet*"},
		"unicom":  {"AS4837", "AS9929", "AS17621", "China Unicom*", "CNCGROUP*"},
		// China TieTong has been part of China Mobile since 2008.
		"mobile": {"AS9808", "AS56040", "AS58453", "AS9394", "China Mobile*", "China TieTong*"},
	}
}

// ispTable canonicalises ISPs: an ASN or an ISP name maps to its group when the table has one,
// so "AS4837" and "China Unicom Liaoning" both become "unicom". Immutable after newISPTable.
type ispTable struct {
	groups   map[string]bool   // group names, lower case
	byASN    map[uint32]string // ASN -> group
	byName   map[string]string // lower-case ISP name -> group
	byPrefix []ispPrefix       // lower-case name prefix -> group, in a fixed order
}

type ispPrefix struct{ prefix, group string }

// newISPTable checks and compiles Config.ISPGroups. A member is an ASN ("AS4837"), an exact ISP
// name ("China Unicom Liaoning", case-insensitive) or a name prefix ending in '*'.
func newISPTable(groups map[string][]string) (*ispTable, error) {
	t := &ispTable{groups: map[string]bool{}, byASN: map[uint32]string{}, byName: map[string]string{}}
	names := make([]string, 0, len(groups))
	for g := range groups {
		names = append(names, g)
	}
	// Sorted, so that overlapping prefixes resolve the same way on every start.
	slices.Sort(names)
	for _, g := range names {
		key := strings.ToLower(strings.TrimSpace(g))
		if key == "" || strings.ContainsAny(key, ",*") {
			return nil, fmt.Errorf("ISP group name %q must be non-empty without ',' or '*'", g)
		}
		if _, ok := parseASN(key); ok {
			return nil, fmt.Errorf("ISP group name %q looks like an ASN; name groups by carrier", g)
		}
		t.groups[key] = true
		for _, m := range groups[g] {
			m = strings.ToLower(strings.TrimSpace(m))
			switch asn, isASN := parseASN(m); {
			case m == "" || m == "*":
				return nil, fmt.Errorf("ISP group %q has an empty member", g)
			case isASN:
				if other, dup := t.byASN[asn]; dup && other != key {
					return nil, fmt.Errorf("ASN %d is in two ISP groups, %q and %q", asn, other, key)
				}
				t.byASN[asn] = key
			case strings.HasSuffix(m, "*"):
				t.byPrefix = append(t.byPrefix, ispPrefix{strings.TrimSuffix(m, "*"), key})
			default:
				if other, dup := t.byName[m]; dup && other != key {
					return nil, fmt.Errorf("ISP name %q is in two ISP groups, %q and %q", m, other, key)
				}
				t.byName[m] = key
			}
		}
	}
	return t, nil
}

// parseASN reads "as4837" (lower case) as 4837.
func parseASN(s string) (uint32, bool) {
	if len(s) < 3 || s[:2] != "as" {
		return 0, false
	}
	n, err := strconv.ParseUint(s[2:], 10, 32)
	return uint32(n), err == nil && n > 0
}

// byNameKey is the canonical key of an ISP name: its group, or the lower-case name.
func (t *ispTable) byNameKey(name string) string {
	name = strings.ToLower(strings.TrimSpace(name))
	if name == "" {
		return ""
	}
	if g, ok := t.byName[name]; ok {
		return g
	}
	for _, p := range t.byPrefix {
		if strings.HasPrefix(name, p.prefix) {
			return p.group
		}
	}
	return name
}

// byASNKey is the canonical key of an ASN: its group, or "as<n>".
func (t *ispTable) byASNKey(asn uint32) string {
	if asn == 0 {
		return ""
	}
	if g, ok := t.byASN[asn]; ok {
		return g
	}
	return "as" + strconv.FormatUint(uint64(asn), 10)
}

// clientKeys returns the canonical keys a client's ISP is known by: one for its ASN and one
// for its name. When the table groups either, both are the group.
func (t *ispTable) clientKeys(asn uint32, name string) (byASN, byName string) {
	a, n := t.byASNKey(asn), t.byNameKey(name)
	switch {
	case t.groups[a]:
		return a, a
	case t.groups[n]:
		return n, n
	}
	return a, n
}

// nodeKeys reads a node's ISP label: comma-separated group names, ASNs or ISP names.
func (t *ispTable) nodeKeys(label string) []string {
	var keys []string
	for item := range strings.SplitSeq(label, ",") {
		item = strings.ToLower(strings.TrimSpace(item))
		var key string
		if asn, ok := parseASN(item); ok {
			key = t.byASNKey(asn)
		} else if t.groups[item] {
			key = item
		} else {
			key = t.byNameKey(item)
		}
		if key != "" && !slices.Contains(keys, key) {
			keys = append(keys, key)
		}
	}
	return keys
}
