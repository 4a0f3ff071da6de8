package chatlink

import (
	"time"

	"roomcast/proto/roompb"
)

// Default delivery settings of a room, when the room service gives none.
const (
	defaultFlushTick      = 100 * time.Millisecond
	defaultGatherMessages = 4
	defaultNormalBudget   = 20
	defaultCriticalBudget = 10
)

// roomSettings are a room's delivery settings with defaults applied.
type roomSettings struct {
	tick           time.Duration
	latencyBudget  time.Duration // how long a normal or bulk message may wait for company; not more than tick: off
	gatherMessages int           // waiting messages that make a frame go despite latencyBudget
	merge          bool
	normalBudget   float64       // messages per member per second; negative: unlimited
	criticalBudget float64       // counted only; negative: unlimited
	historyKeep    int           // the room's history retention, where narrower than the stream's:
	historyAge     time.Duration // newest messages kept (0: the stream's), and for how long (0: the stream's)
	viewerTags     []string      // tags the room's viewer counts count on their own (viewers.go)
	memberNotices  bool          // members are told of joins and leaves while the room is small
}

// resolveSettings applies the node's defaults (cfg) to the room's settings st.
func resolveSettings(st *roompb.RoomSettings, cfg *Config) roomSettings {
	s := roomSettings{tick: cfg.FlushTick, latencyBudget: cfg.LatencyBudget, gatherMessages: cfg.GatherMessages,
		merge: true, normalBudget: defaultNormalBudget, criticalBudget: defaultCriticalBudget}
	if st == nil {
		return s
	}
	if st.FlushTickMs > 0 {
		s.tick = time.Duration(st.FlushTickMs) * time.Millisecond
	}
	if st.LatencyBudgetMs > 0 {
		s.latencyBudget = time.Duration(st.LatencyBudgetMs) * time.Millisecond
	}
	if st.GatherMessages > 0 {
		s.gatherMessages = int(st.GatherMessages)
	}
	s.merge = !st.NoMerge
	if st.NormalBudget != 0 {
		s.normalBudget = float64(st.NormalBudget)
	}
	if st.CriticalBudget != 0 {
		s.criticalBudget = float64(st.CriticalBudget)
	}
	s.historyKeep = int(st.HistoryMaxMessages)
	s.historyAge = time.Duration(st.HistoryMaxAgeS) * time.Second
	s.viewerTags = st.ViewerTags
	s.memberNotices = st.MemberNotices
	return s
}

// historyRetention returns the room's history retention (roomSettings.historyKeep, historyAge).
func (f *roomFanout) historyRetention() (keep int, age time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.settings.historyKeep, f.settings.historyAge
}

// setSettings replaces the room's settings, as an announcement of a change does.
func (f *roomFanout) setSettings(st *roompb.RoomSettings) {
	f.mu.Lock()
	f.settings = resolveSettings(st, &f.r.t.n.cfg)
	f.mu.Unlock()
}
