package cdnpusher

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons a segment never reached storage (the gaps metric's label).
const (
	gapQueueFull = "queue_full" // the queue was full: the oldest waiting segment made room
	gapGaveUp    = "gave_up"    // storage failed for longer than GiveUpAfter
	gapShutdown  = "shutdown"   // Close's context ended before storage took it
)

// What failed when expired segments were not deleted (the delete errors metric's label).
const (
	deleteErrList   = "list"   // a listing request: the folder's segments wait for the next sweep
	deleteErrDelete = "delete" // a segment's deletion
)

// Reasons a message was refused (the refused metric's label).
const (
	refusedReleased = "released" // its window is another pusher's (ErrReleased)
	refusedTargeted = "targeted" // it has a tag expression (ErrTargeted)
	refusedInvalid  = "invalid"  // ErrInvalid
	refusedClosed   = "closed"   // the pusher was closed (ErrClosed)
)

// refusalOf is the refused metric's label for an error of Add.
func refusalOf(err error) string {
	switch {
	case errors.Is(err, ErrReleased):
		return refusedReleased
	case errors.Is(err, ErrTargeted):
		return refusedTargeted
	case errors.Is(err, ErrClosed):
		return refusedClosed
	}
	return refusedInvalid
}

// metrics are the pusher's Prometheus instruments, resolved once: Add only increments.
type metrics struct {
	messages     prometheus.Counter
	late         prometheus.Counter
	sampled      prometheus.Counter
	segments     prometheus.Counter
	emptySegs    prometheus.Counter
	bytes        prometheus.Counter
	writeSeconds prometheus.Histogram
	failures     prometheus.Counter
	retries      prometheus.Counter
	gaps         map[string]prometheus.Counter
	refused      map[string]prometheus.Counter
	deleted      prometheus.Counter
	deleteErrs   map[string]prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, queued, rooms func() float64) *metrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "roomcast_cdnpusher_" + name, Help: help})
	}
	gaps := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roomcast_cdnpusher_gaps_total",
		Help: "Segments that never reached storage (missing indexes for clients), by reason " +
			"(queue_full, gave_up, shutdown).",
	}, []string{"reason"})
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roomcast_cdnpusher_refused_messages_total",
		Help: "Messages Add refused, in no segment, by reason (released: their window is another " +
			"pusher's after a handoff; targeted, invalid, closed).",
	}, []string{"reason"})
	deleteErrs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roomcast_cdnpusher_delete_errors_total",
		Help: "Failures of the sweep that deletes expired segments, by what failed (list: a listing " +
			"request; delete: one segment's deletion). What was not deleted is tried again at the next sweep.",
	}, []string{"op"})
	m := &metrics{
		messages: counter("messages_total", "Messages handed to the pusher."),
		late:     counter("late_messages_total", "Messages that arrived after their window was written; they went into the next one."),
		sampled:  counter("sampled_messages_total", "Messages left out of their segment by the per-window cap."),
		segments: counter("segments_written_total", "Segments written to storage (empty ones included)."),
		emptySegs: counter("empty_segments_written_total",
			"Segments written with no message, for quiet windows of active rooms."),
		bytes: counter("segment_bytes_total", "Bytes of segments written to storage (compressed)."),
		writeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "roomcast_cdnpusher_write_seconds",
			Help:    "Time of a successful segment write to storage.",
			Buckets: prometheus.ExponentialBuckets(0.002, 2, 12),
		}),
		failures: counter("write_failures_total", "Segment write attempts that failed."),
		retries:  counter("write_retries_total", "Segment write attempts made again after a failure."),
		gaps:     map[string]prometheus.Counter{},
		refused:  map[string]prometheus.Counter{},
		deleted: counter("segments_deleted_total",
			"Expired segments deleted from storage (older than the segment TTL). Pushers sweeping the same prefix at once may each count one."),
		deleteErrs: map[string]prometheus.Counter{},
	}
	for _, op := range []string{deleteErrList, deleteErrDelete} {
		m.deleteErrs[op] = deleteErrs.WithLabelValues(op)
	}
	for _, r := range []string{gapQueueFull, gapGaveUp, gapShutdown} {
		m.gaps[r] = gaps.WithLabelValues(r)
	}
	for _, r := range []string{refusedReleased, refusedTargeted, refusedInvalid, refusedClosed} {
		m.refused[r] = refused.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.messages, m.late, m.sampled, m.segments, m.emptySegs, m.bytes, m.writeSeconds,
			m.failures, m.retries, gaps, refused, m.deleted, deleteErrs,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "roomcast_cdnpusher_queued_segments",
				Help: "Segments waiting for storage.",
			}, queued),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "roomcast_cdnpusher_rooms",
				Help: "Rooms the pusher writes segments for.",
			}, rooms))
	}
	return m
}
