package presence

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"roomcast/internal/buspb"
)

// webhooks batches an app's online/offline events and posts them to its webhook URL. Each
// batch of events reaches one instance (the effects queue group), so each event is posted once.
// A post that fails is logged and dropped: the webhook is a notification, the presence queries
// are the truth.
type webhooks struct {
	s *Service

	mu      sync.Mutex // guards pending
	pending map[string][]*buspb.SessionEvent
}

// WebhookBatch is the JSON body posted to an app's webhook.
type WebhookBatch struct {
	App    string         `json:"app"`
	Events []WebhookEvent `json:"events"`
}

// WebhookEvent is one session going online or offline.
type WebhookEvent struct {
	// Kind is "online" or "offline".
	Kind      string `json:"kind"`
	UID       string `json:"uid"`
	Room      string `json:"room"`
	Node      string `json:"node"`
	SessionID string `json:"session_id"`
	Device    string `json:"device"`
	TimeMS    int64  `json:"time_ms"`
	// Reason says why an offline event came when the session did not end on its node but
	// with the node: "lease ended" or "node restarted". Absent otherwise.
	Reason string `json:"reason,omitempty"`
}

func (w *webhooks) add(app string, evs []*buspb.SessionEvent) {
	if w.s.cfg.Webhooks[app] == "" {
		return
	}
	w.mu.Lock()
	w.pending[app] = append(w.pending[app], evs...)
	w.mu.Unlock()
}

func (w *webhooks) loop() {
	defer w.s.wg.Done()
	if len(w.s.cfg.Webhooks) == 0 {
		<-w.s.stop
		return
	}
	t := time.NewTicker(w.s.cfg.WebhookEvery)
	defer t.Stop()
	for {
		select {
		case <-w.s.stop:
			w.flush()
			return
		case <-t.C:
			w.flush()
		}
	}
}

func (w *webhooks) flush() {
	w.mu.Lock()
	pending := w.pending
	w.pending = make(map[string][]*buspb.SessionEvent)
	w.mu.Unlock()
	for app, evs := range pending {
		if err := w.post(app, evs); err != nil {
			w.s.m.webhookFailed.Inc()
			w.s.log.Warn("webhook post failed", "app", app, "events", len(evs), "err", err)
			continue
		}
		w.s.m.webhookOK.Inc()
	}
}

func (w *webhooks) post(app string, evs []*buspb.SessionEvent) error {
	batch := WebhookBatch{App: app, Events: make([]WebhookEvent, len(evs))}
	for i, ev := range evs {
		kind := "online"
		if ev.Kind == buspb.SessionEvent_KIND_LOGOUT {
			kind = "offline"
		}
		batch.Events[i] = WebhookEvent{Kind: kind, UID: ev.Uid, Room: ev.Room, Node: ev.Node, SessionID: ev.SessionId, Device: ev.Device, TimeMS: ev.TimeMs, Reason: ev.Reason}
	}
	body, err := json.Marshal(batch)
	if err != nil {
		return err
	}
	resp, err := w.s.cfg.HTTPClient.Post(w.s.cfg.Webhooks[app], "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("webhook answered %s", strings.TrimSpace(resp.Status))
	}
	return nil
}
