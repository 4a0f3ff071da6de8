package dispatcher

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oschwald/geoip2-golang/v2"
	"github.com/oschwald/maxminddb-golang/v2"
)

// location is what the dispatcher knows of a client: its region and the canonical keys of its
// ISP (by ASN and by name, see ispTable.clientKeys), all interned; zero is unknown.
type location struct {
	region     region
	ispA, ispB uint32
	// near is the client's region's near-region list (Config.NearRegions), nil without one;
	// it follows from region, so it is not part of the bucket.
	near *nearList
}

// bucket is the ranking-cache key: clients with the same bucket get rankings from the same
// candidate list.
func (l location) bucket() bucketKey {
	return bucketKey{continent: l.region.continent, country: l.region.country, subdivision: l.region.subdivision, ispA: l.ispA, ispB: l.ispB}
}

// geoKind is the role of a database file.
type geoKind int

const (
	kindCity geoKind = iota // GeoIP2/GeoLite2 City or Country (or Enterprise): the region
	kindISP                 // GeoIP2 ISP or GeoLite2 ASN: the ISP
)

func (k geoKind) String() string {
	if k == kindCity {
		return "city"
	}
	return "isp"
}

// geoFile is one loaded database. The file is read into memory rather than memory-mapped:
// a reload swaps the pointer and requests still using the old copy keep it alive until they
// finish, so nothing is ever unmapped under a lookup and no request is dropped or blocked.
type geoFile struct {
	kind    geoKind
	path    string
	stamp   fileStamp
	dbType  string
	built   time.Time
	loaded  time.Time
	reader  *geoip2.Reader
	useASN  bool // an ASN database: ASN() rather than ISP()
	noState bool // a Country database: no subdivisions

	// index finds a client's record in the same bytes as reader without decoding it, so a
	// decoded record can be memoised by its offset: a flash crowd costs one tree walk per
	// client, not one decode (which is 1-2 µs for a City record).
	index *maxminddb.Reader

	// memo holds decoded records, direct-mapped by offset: slot = offset<<32 | record id+1,
	// so a lookup is one atomic load, a collision only costs a decode, and the table has no
	// pointers for the garbage collector to scan.
	memo []atomic.Uint64

	recMu  sync.Mutex // guards recIDs; serialises appends to recs
	recIDs map[geoRecord]uint32
	recs   atomic.Pointer[[]geoRecord] // by id; elements never change once published
}

// memoSlots is the size of each database's memo (2 MiB): enough for the records a crowd from a
// few countries touches (a whole City database has a few hundred thousand).
const memoSlots = 1 << 18

func memoSlot(off uint64) uint64 { return off * 0x9e3779b97f4a7c15 >> (64 - 18) }

// geoRecord is a decoded record, reduced to what scoring uses.
type geoRecord struct {
	region     region
	ispA, ispB uint32
}

// recordID interns rec among the database's distinct records.
func (f *geoFile) recordID(rec geoRecord) uint32 {
	f.recMu.Lock()
	defer f.recMu.Unlock()
	if id, ok := f.recIDs[rec]; ok {
		return id
	}
	recs := *f.recs.Load()
	id := uint32(len(recs))
	recs = append(recs, rec)
	f.recs.Store(&recs)
	f.recIDs[rec] = id
	return id
}

type fileStamp struct {
	size  int64
	mtime time.Time
}

func statFile(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{size: fi.Size(), mtime: fi.ModTime()}, nil
}

// openGeoFile reads and checks a database for a role.
func openGeoFile(kind geoKind, path string, now time.Time) (*geoFile, error) {
	stamp, err := statFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s database: %w", kind, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s database: %w", kind, err)
	}
	reader, err := geoip2.OpenBytes(data)
	if err != nil {
		return nil, fmt.Errorf("%s database %s: %w", kind, path, err)
	}
	index, err := maxminddb.OpenBytes(data)
	if err != nil {
		return nil, fmt.Errorf("%s database %s: %w", kind, path, err)
	}
	f := &geoFile{
		kind: kind, path: path, stamp: stamp, reader: reader, index: index, loaded: now,
		memo: make([]atomic.Uint64, memoSlots), recIDs: map[geoRecord]uint32{},
		dbType: reader.Metadata().DatabaseType,
		built:  time.Unix(int64(reader.Metadata().BuildEpoch), 0).UTC(),
	}
	f.recs.Store(&[]geoRecord{})
	// Ask the reader whether it can answer this role: it knows which database types have
	// which records.
	var invalid geoip2.InvalidMethodError
	probe := netip.IPv4Unspecified()
	switch kind {
	case kindCity:
		if _, err := reader.City(probe); errors.As(err, &invalid) {
			return nil, fmt.Errorf("city database %s is a %s database; want a City or Country one", path, f.dbType)
		}
		f.noState = strings.Contains(f.dbType, "Country")
	case kindISP:
		if _, err := reader.ISP(probe); errors.As(err, &invalid) {
			if _, err := reader.ASN(probe); errors.As(err, &invalid) {
				return nil, fmt.Errorf("ISP database %s is a %s database; want an ISP or ASN one", path, f.dbType)
			}
			f.useASN = true
		}
	}
	return f, nil
}

// lookup returns ip's record, decoding it on the first lookup of its database record.
func (f *geoFile) lookup(ip netip.Addr, g *geoState) (geoRecord, bool) {
	res := f.index.Lookup(ip)
	if !res.Found() {
		return geoRecord{}, false
	}
	off := uint64(res.Offset())
	slot := &f.memo[memoSlot(off)]
	if v := slot.Load(); v>>32 == off && v != 0 {
		return (*f.recs.Load())[uint32(v)-1], true
	}
	rec, ok := f.decode(ip, g)
	if ok && off < 1<<32 {
		slot.Store(off<<32 | uint64(f.recordID(rec)+1))
	}
	return rec, ok
}

func (f *geoFile) decode(ip netip.Addr, g *geoState) (geoRecord, bool) {
	if f.kind == kindCity {
		c, err := f.reader.City(ip)
		if err != nil || !c.HasData() {
			return geoRecord{}, false
		}
		r := region{continent: g.in.id(c.Continent.Code), country: g.in.id(c.Country.ISOCode)}
		if c.Country.ISOCode == "" {
			// Anycast or satellite networks: where the block is registered is the best guess.
			r.country = g.in.id(c.RegisteredCountry.ISOCode)
		}
		if len(c.Subdivisions) > 0 && c.Subdivisions[0].ISOCode != "" && r.country != 0 {
			r.subdivision = g.in.id(g.in.name(r.country) + "/" + c.Subdivisions[0].ISOCode)
		}
		return geoRecord{region: r}, r.continent != 0 || r.country != 0
	}
	var asn uint32
	var name string
	if f.useASN {
		a, err := f.reader.ASN(ip)
		if err != nil || !a.HasData() {
			return geoRecord{}, false
		}
		asn, name = uint32(a.AutonomousSystemNumber), a.AutonomousSystemOrganization
	} else {
		i, err := f.reader.ISP(ip)
		if err != nil || !i.HasData() {
			return geoRecord{}, false
		}
		asn, name = uint32(i.AutonomousSystemNumber), i.ISP
		if name == "" {
			name = i.AutonomousSystemOrganization
		}
	}
	a, b := g.isps.clientKeys(asn, name)
	return geoRecord{ispA: g.in.id(a), ispB: g.in.id(b)}, a != "" || b != ""
}

// geoState is the loaded pair of databases; either may be nil. Swapped whole on reload.
type geoState struct {
	city, isp *geoFile
	in        *interner
	isps      *ispTable
}

// locate finds a client. Addresses that cannot be placed (private, loopback, unspecified)
// and addresses missing from the databases give an unknown location: the client is then
// dispatched on load alone.
func (g *geoState) locate(ip netip.Addr) location {
	var loc location
	if !ip.IsValid() || !routable(ip) {
		return loc
	}
	if g.city != nil {
		if rec, ok := g.city.lookup(ip, g); ok {
			loc.region = rec.region
		}
	}
	if g.isp != nil {
		if rec, ok := g.isp.lookup(ip, g); ok {
			loc.ispA, loc.ispB = rec.ispA, rec.ispB
		}
	}
	return loc
}

// routable says whether ip is a public unicast address worth looking up.
func routable(ip netip.Addr) bool {
	return ip.IsGlobalUnicast() && !ip.IsPrivate()
}

// geoLoader owns the database files: it loads them at start and reloads them when they change
// or when asked (SIGHUP), keeping the old copy when a new one does not load.
type geoLoader struct {
	cityPath, ispPath string

	state atomic.Pointer[geoState]

	mu      sync.Mutex // serialises reloads; guards lastErr
	lastErr map[geoKind]string
}

func newGeoLoader(cityPath, ispPath string, in *interner, isps *ispTable, now time.Time) (*geoLoader, error) {
	l := &geoLoader{cityPath: cityPath, ispPath: ispPath, lastErr: map[geoKind]string{}}
	st := &geoState{in: in, isps: isps}
	var err error
	if cityPath != "" {
		if st.city, err = openGeoFile(kindCity, cityPath, now); err != nil {
			return nil, err
		}
	}
	if ispPath != "" {
		if st.isp, err = openGeoFile(kindISP, ispPath, now); err != nil {
			return nil, err
		}
	}
	l.state.Store(st)
	return l, nil
}

// reloadResult is what happened to one database file in a reload.
type reloadResult struct {
	kind geoKind
	path string
	err  error // nil: replaced
	news bool  // err differs from the previous attempt's (or the reload was forced)
}

// reload reopens the files that changed (or all of them when force is set). A file that fails
// to load leaves the previous copy in service and is reported in Health until a later reload
// succeeds.
func (l *geoLoader) reload(force bool, now time.Time) []reloadResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := *l.state.Load()
	var results []reloadResult
	replaced := false
	for _, slot := range []struct {
		kind geoKind
		path string
		cur  **geoFile
	}{{kindCity, l.cityPath, &next.city}, {kindISP, l.ispPath, &next.isp}} {
		if slot.path == "" {
			continue
		}
		if !force {
			if st, err := statFile(slot.path); err == nil && st == (*slot.cur).stamp {
				continue
			}
		}
		f, err := openGeoFile(slot.kind, slot.path, now)
		if err != nil {
			results = append(results, reloadResult{slot.kind, slot.path, err, force || l.lastErr[slot.kind] != err.Error()})
			l.lastErr[slot.kind] = err.Error()
			continue
		}
		delete(l.lastErr, slot.kind)
		*slot.cur = f
		replaced = true
		results = append(results, reloadResult{kind: slot.kind, path: slot.path, news: true})
	}
	if replaced {
		l.state.Store(&next)
	}
	return results
}

// DBStatus describes one GeoIP database in Health.
type DBStatus struct {
	Path      string    `json:"path"`
	Type      string    `json:"type,omitempty"`
	Built     time.Time `json:"built,omitzero"`
	Loaded    time.Time `json:"loaded,omitzero"`
	LastError string    `json:"last_error,omitempty"`
}

func (l *geoLoader) status(kind geoKind) *DBStatus {
	st := l.state.Load()
	f, path := st.city, l.cityPath
	if kind == kindISP {
		f, path = st.isp, l.ispPath
	}
	if path == "" {
		return nil
	}
	s := &DBStatus{Path: path}
	if f != nil {
		s.Type, s.Built, s.Loaded = f.dbType, f.built, f.loaded
	}
	l.mu.Lock()
	s.LastError = l.lastErr[kind]
	l.mu.Unlock()
	return s
}
