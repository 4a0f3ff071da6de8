package room

import "github.com/prometheus/client_golang/prometheus"

// metrics are an instance's counters of its way in.
type metrics struct {
	accepted    prometheus.Counter // messages accepted (before the bulk cap)
	bulkSampled prometheus.Counter // bulk messages the room's cap left out
	batches     prometheus.Counter // room batches published
	unsent      prometheus.Counter // accepted messages whose publish failed
}

func newMetrics(reg prometheus.Registerer) *metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "roomcast", Subsystem: "room", Name: name, Help: help})
	}
	m := &metrics{
		accepted:    c("messages_accepted_total", "Messages the room service accepted for broadcast."),
		bulkSampled: c("bulk_sampled_out_total", "Bulk messages left out by their room's bulk cap (RoomSettings.bulk_per_second) before the bus."),
		batches:     c("batches_published_total", "Room batches published to the rooms' nodes (one per room and batch window)."),
		unsent:      c("messages_unsent_total", "Accepted messages whose broadcast failed (bus down or closed): not delivered, not kept."),
	}
	for _, c := range []*prometheus.Counter{&m.accepted, &m.bulkSampled, &m.batches, &m.unsent} {
		*c = register(reg, *c)
	}
	return m
}

// register registers c with reg (when not nil) and returns it, or the counter already
// registered under its name: an instance restarted in the same process (roles.RestartRooms)
// counts on where its predecessor stopped.
func register(reg prometheus.Registerer, c prometheus.Counter) prometheus.Counter {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		if are, ok := err.(prometheus.AlreadyRegisteredError); ok {
			return are.ExistingCollector.(prometheus.Counter)
		}
		panic(err) // a name clash with another collector: a programming error
	}
	return c
}
