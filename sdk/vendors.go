package sdk

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"time"

	"roomcast/proto/clientpb"
	"roomcast/proto/segment"
)

// vendorMaxDown is the longest a failing vendor is passed over before it is tried first again.
const vendorMaxDown = 30 * time.Second

// vendor is one place the room's segments can be fetched from, with how it has been doing.
// Its state is guarded by the cdnPoller's mu.
type vendor struct {
	template  string
	weight    uint32
	fails     int       // failures in a row
	downUntil time.Time // tried only after the vendors that are up until then
}

// eligibleVendors returns the vendors of list that serve region (those listing it or no region
// at all), or all of them if none does; a vendor of old with the same URL template keeps its
// state.
func eligibleVendors(list []*clientpb.CdnVendor, region string, old []*vendor) []*vendor {
	serves := func(v *clientpb.CdnVendor) bool {
		return len(v.GetRegions()) == 0 || region != "" && slices.Contains(v.GetRegions(), region)
	}
	var out []*vendor
	for _, all := range []bool{false, true} {
		for _, cv := range list {
			if !all && !serves(cv) {
				continue
			}
			v := &vendor{template: cv.GetUrlTemplate(), weight: cv.GetWeight()}
			if i := slices.IndexFunc(old, func(o *vendor) bool { return o.template == v.template }); i >= 0 {
				v.fails, v.downUntil = old[i].fails, old[i].downUntil
			}
			out = append(out, v)
		}
		if len(out) > 0 {
			break
		}
	}
	return out
}

// orderLocked returns the vendors in the order one fetch tries them: those that are up by
// weight (a weighted random order, so that the first choice follows the weights), then those
// of weight 0 (kept only as fallbacks), then those that failed lately, the soonest due first.
// Caller holds p.mu.
func (p *cdnPoller) orderLocked(now time.Time) []*vendor {
	type keyed struct {
		v   *vendor
		key float64
	}
	var up []keyed
	var down []*vendor
	for _, v := range p.vendors {
		switch {
		case now.Before(v.downUntil):
			down = append(down, v)
		case v.weight == 0:
			up = append(up, keyed{v, -1})
		default:
			// Efraimidis and Spirakis: sorting by u^(1/w) draws without replacement by weight.
			up = append(up, keyed{v, math.Pow(rand.Float64(), 1/float64(v.weight))})
		}
	}
	slices.SortFunc(up, func(a, b keyed) int { return cmp.Compare(b.key, a.key) })
	slices.SortFunc(down, func(a, b *vendor) int { return a.downUntil.Compare(b.downUntil) })
	order := make([]*vendor, 0, len(p.vendors))
	for _, k := range up {
		order = append(order, k.v)
	}
	return append(order, down...)
}

// fetch asks the vendors for segment index, one after another until one serves it or says it
// is not there (404). It reports false when it got no segment.
func (p *cdnPoller) fetch(snap snapshot, index int64) (*clientpb.Segment, bool) {
	p.mu.Lock()
	order, hc := p.orderLocked(time.Now()), p.hc
	p.mu.Unlock()
	w := snap.conf.GetWindowMs()
	want := segment.Want{App: snap.app, Room: snap.room, WindowMs: w, Index: index}
	timeout := min(max(2*time.Duration(w)*time.Millisecond, time.Second), 5*time.Second)
	for _, v := range order {
		seg, status, err := p.get(hc, segment.URL(v.template, snap.app, snap.room, w, index), want, timeout)
		switch {
		case err == nil:
			p.hits.Add(1)
			p.vendorDid(v, nil)
			return seg, true
		case status == http.StatusNotFound:
			p.misses.Add(1)
			return nil, false
		case p.ctx.Err() != nil:
			return nil, false
		}
		p.failures.Add(1)
		p.vendorDid(v, err)
	}
	return nil, false
}

// get fetches one segment URL and decodes it. status is the HTTP status, 0 without an answer.
func (p *cdnPoller) get(hc *http.Client, url string, want segment.Want, timeout time.Duration) (*clientpb.Segment, int, error) {
	ctx, cancel := context.WithTimeout(p.ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("roomcast: segment %d: %w", want.Index, err)
	}
	p.polls.Add(1)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("roomcast: segment %d: %w", want.Index, err)
	}
	defer resp.Body.Close()
	// Read to the end of what a segment may be, so that the connection can serve the next poll.
	body, err := io.ReadAll(io.LimitReader(resp.Body, segment.MaxDecoded+1))
	switch {
	case resp.StatusCode != http.StatusOK:
		return nil, resp.StatusCode, fmt.Errorf("roomcast: segment %d: %s", want.Index, resp.Status)
	case err != nil:
		return nil, resp.StatusCode, fmt.Errorf("roomcast: segment %d: %w", want.Index, err)
	}
	seg, err := segment.Decode(body, want)
	if err != nil {
		return nil, resp.StatusCode, fmt.Errorf("roomcast: %s: %w", url, err)
	}
	return seg, resp.StatusCode, nil
}

// vendorDid records how a request to v went (err nil: it served a segment). A failing vendor is
// passed over for a second, doubling with each failure in a row up to vendorMaxDown; the first
// failure and the recovery are logged.
func (p *cdnPoller) vendorDid(v *vendor, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		if v.fails > 0 {
			p.log.Info("roomcast: CDN vendor serves again", "vendor", v.template, "after_failures", v.fails)
		}
		v.fails, v.downUntil = 0, time.Time{}
		return
	}
	v.fails++
	if v.fails == 1 {
		p.log.Warn("roomcast: CDN vendor failed; trying the others", "vendor", v.template, "err", err)
	}
	v.downUntil = time.Now().Add(min(time.Second<<min(v.fails-1, 10), vendorMaxDown))
}
