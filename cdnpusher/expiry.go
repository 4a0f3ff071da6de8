package cdnpusher

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"

	"roomcast/internal/auth"
	"roomcast/proto/segment"
)

// DefaultSegmentTTL is Config.SegmentTTL's default, and --segment-ttl's.
const DefaultSegmentTTL = 24 * time.Hour

// sweeper deletes expired segments: every object under the pusher's prefix laid out as
// {app}/{room}/{window_ms}/{index} whose window ended more than Config.SegmentTTL ago. It
// reads what to delete from the bucket, not from memory, so segments that an earlier run of
// the pusher wrote, another pusher wrote, or a room that left CDN mode left behind expire too.
// Every pusher sweeps the whole prefix: a deletion is idempotent, and a sweep that finds
// nothing to delete costs one listing request per room.
//
// A sweep never touches the pusher's writes (its own goroutine, no lock shared with them); what
// it fails to delete stays in the bucket and is found again by the next sweep.
type sweeper struct {
	client   *minio.Client
	bucket   string
	prefix   string
	ttl      time.Duration
	interval time.Duration
	now      func() time.Time
	metrics  *metrics
	log      *slog.Logger

	failing atomic.Bool // the last sweep had errors: logs the trouble once and the recovery once
}

// sweepResult is what one sweep did.
type sweepResult struct {
	deleted    int   // segments deleted
	listErrs   int   // listing requests that failed
	deleteErrs int   // segments whose deletion failed
	firstErr   error // the first error met, for the log
}

// run sweeps until ctx ends: soon after the start (a restarted pusher catches up at once),
// then every interval, jittered by a quarter either way so that pushers spread their sweeps.
func (s *sweeper) run(ctx context.Context) {
	wait := rand.N(min(s.interval, 30*time.Second) + 1)
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		// A sweep of a large bucket takes a while; one of storage that hangs ends with the
		// next interval, and the next sweep takes up what it left.
		sctx, cancel := context.WithTimeout(ctx, max(s.interval, time.Minute))
		s.sweep(sctx)
		cancel()
		wait = s.interval*3/4 + rand.N(s.interval/2+1)
	}
}

// sweep deletes every expired segment under the prefix, in batches of up to 1,000 keys (one
// DeleteObjects request each), counts what it did and logs a failing sweep once.
func (s *sweeper) sweep(ctx context.Context) sweepResult {
	var res sweepResult
	cutoffMs := s.now().Add(-s.ttl).UnixMilli()
	results, err := s.client.RemoveObjectsWithIter(ctx, s.bucket, s.expired(ctx, cutoffMs, &res), minio.RemoveObjectsOptions{})
	if err != nil {
		res.deleteErrs++
		res.firstErr = err
	} else {
		for r := range results {
			if r.Err != nil && errors.Is(r.Err, context.Canceled) {
				continue // the pusher is closing: the next run sweeps it
			}
			if r.Err != nil {
				res.deleteErrs++
				if res.firstErr == nil {
					res.firstErr = r.Err
				}
				continue
			}
			res.deleted++
		}
	}
	s.metrics.deleted.Add(float64(res.deleted))
	s.metrics.deleteErrs[deleteErrList].Add(float64(res.listErrs))
	s.metrics.deleteErrs[deleteErrDelete].Add(float64(res.deleteErrs))
	switch {
	case res.firstErr != nil && !errors.Is(res.firstErr, context.Canceled):
		if s.failing.CompareAndSwap(false, true) {
			s.log.Warn("cdnpusher: deleting expired segments failed; the next sweep tries again",
				"deleted", res.deleted, "list_errors", res.listErrs, "delete_errors", res.deleteErrs, "err", res.firstErr)
		}
	case res.firstErr == nil:
		if s.failing.CompareAndSwap(true, false) {
			s.log.Info("cdnpusher: expired segments deleted again", "deleted", res.deleted)
		}
	}
	s.log.Debug("cdnpusher: sweep", "deleted", res.deleted, "list_errors", res.listErrs, "delete_errors", res.deleteErrs)
	return res
}

// expired yields the expired segments under the prefix: for each app, room and window folder,
// the indexes whose window ended at or before cutoffMs. A listing that fails is counted in res
// and skipped. Keys that are not laid out as segments are left alone.
func (s *sweeper) expired(ctx context.Context, cutoffMs int64, res *sweepResult) iter.Seq[minio.ObjectInfo] {
	return func(yield func(minio.ObjectInfo) bool) {
		for appDir := range s.folders(ctx, s.prefix, res) {
			if !validName(appDir, s.prefix) {
				continue
			}
			for roomDir := range s.folders(ctx, appDir, res) {
				if !validName(roomDir, appDir) {
					continue
				}
				for windowDir := range s.folders(ctx, roomDir, res) {
					name := strings.TrimSuffix(windowDir[len(roomDir):], "/")
					windowMs, err := strconv.ParseUint(name, 10, 32)
					if err != nil || windowMs == 0 || !digits(name) {
						continue
					}
					if !s.expiredIn(ctx, windowDir, segment.Index(cutoffMs, uint32(windowMs)), res, yield) {
						return
					}
				}
			}
		}
	}
}

// expiredIn yields the segments of one window folder with an index below cutoff, and reports
// false when yield asked to stop. S3 lists keys in byte order and a folder's indexes all have
// the same number of digits (10 for 1 s windows until the year 2286), so the listing stops at
// the first index that has not expired: a sweep costs one listing request per room, however
// many live segments the room has.
func (s *sweeper) expiredIn(ctx context.Context, dir string, cutoff int64, res *sweepResult, yield func(minio.ObjectInfo) bool) bool {
	for obj := range s.client.ListObjectsIter(ctx, s.bucket, minio.ListObjectsOptions{Prefix: dir}) {
		if obj.Err != nil {
			s.listFailed(res, obj.Err)
			return true
		}
		name := obj.Key[len(dir):]
		if !digits(name) {
			continue // a folder below, or not a segment
		}
		index, err := strconv.ParseInt(name, 10, 64)
		if err != nil {
			continue
		}
		if index >= cutoff {
			return true
		}
		if !yield(minio.ObjectInfo{Key: obj.Key}) {
			return false
		}
	}
	return true
}

// folders yields the folders directly under prefix (keys ending in "/"), in byte order.
func (s *sweeper) folders(ctx context.Context, prefix string, res *sweepResult) iter.Seq[string] {
	return func(yield func(string) bool) {
		for obj := range s.client.ListObjectsIter(ctx, s.bucket, minio.ListObjectsOptions{Prefix: prefix}) {
			if obj.Err != nil {
				s.listFailed(res, obj.Err)
				return
			}
			if strings.HasSuffix(obj.Key, "/") && !yield(obj.Key) {
				return
			}
		}
	}
}

func (s *sweeper) listFailed(res *sweepResult, err error) {
	if errors.Is(err, context.Canceled) {
		return // the pusher is closing
	}
	res.listErrs++
	if res.firstErr == nil {
		res.firstErr = err
	}
}

// validName reports whether folder, under parent, names an app or a room: the segments' names
// follow auth.ValidName, so nothing else under the prefix is taken for a segment's folder.
func validName(folder, parent string) bool {
	return auth.ValidName(strings.TrimSuffix(folder[len(parent):], "/"))
}

// digits reports whether s is a non-empty run of ASCII digits.
func digits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
