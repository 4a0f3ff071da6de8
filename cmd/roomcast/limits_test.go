package main

import (
	"flag"
	"fmt"
	"testing"

	"roomcast/api"
	"roomcast/cdnpusher"
	"roomcast/chatlink"
	"roomcast/dispatcher"
	"roomcast/internal/ratelimit"
	"roomcast/presence"
	"roomcast/room"
	"roomcast/roomqueue"
	"roomcast/store/cdnstore"
	"roomcast/store/historystore"
	"roomcast/store/inbox"
)

// TestFlagDefaultsAreTheComponents: with no flags given, every command's flags hold the
// components' own defaults (chatlink.DefaultLimits and DefaultConfig, api.DefaultCallLimits,
// the room, room queue, dispatcher, presence, CDN and inbox defaults), so --help shows what a component run
// without flags (a test, the dev cluster) does, and no second copy can drift.
func TestFlagDefaultsAreTheComponents(t *testing.T) {
	lim, cl := chatlink.DefaultLimits(), chatlink.DefaultConfig()
	chatlinkFlags := map[string]any{
		"limit-logins-per-ip":      lim.LoginsPerIP,
		"limit-logins-per-app":     lim.LoginsPerApp,
		"limit-joins-per-room":     lim.JoinsPerRoom,
		"limit-sends-per-conn":     lim.SendsPerConn,
		"limit-sends-per-user":     lim.SendsPerUser,
		"limit-sends-per-room":     lim.SendsPerRoom,
		"limit-connections-per-ip": lim.ConnectionsPerIP,
		"login-rate":               lim.LoginRate,
		"login-concurrency":        lim.LoginConcurrency,
		"login-queue":              lim.LoginQueue,
		"limit-table-size":         lim.TableSize,
		"flush-tick":               cl.FlushTick,
		"order-hold":               cl.OrderHold,
		"order-fill-timeout":       cl.OrderFillTimeout,
		"gather-messages":          cl.GatherMessages,
		"phase-members":            cl.PhaseMembers,
		"latency-budget":           cl.LatencyBudget,
		"egress-capacity":          cl.EgressCapacity,
	}
	servicesFlags := map[string]any{
		"limit-api-calls-per-key":         api.DefaultCallLimits().PerKey,
		"room-share":                      dispatcher.DefaultRoomShare,
		"queue-max-entries":               roomqueue.DefaultMaxEntries,
		"queue-max-value":                 roomqueue.DefaultMaxValueBytes,
		"history-per-room":                historystore.PerRoom,
		"history-max-age":                 room.DefaultHistoryMaxAge,
		"room-batch-window":               room.DefaultBatchWindow,
		"room-bulk-per-second":            room.DefaultBulkPerSecond,
		"room-member-sends-per-second":    room.DefaultMemberSendsPerSecond,
		"room-member-critical-per-second": room.DefaultMemberCriticalPerSecond,
		"inbox-expiry":                    inbox.DefaultExpiry,
		"inbox-max-expiry":                inbox.DefaultMaxExpiry,
		"inbox-max-per-user":              inbox.DefaultMaxPerUser,
		"presence-webhook-every":          presence.DefaultWebhookEvery,
		"cdn-window":                      cdnstore.DefaultWindow,
	}
	pusherFlags := map[string]any{
		"cdn-window":       cdnstore.DefaultWindow,
		"cdn-max-messages": cdnpusher.DefaultMaxMessages,
		"segment-ttl":      cdnpusher.DefaultSegmentTTL,
	}
	want := map[string]map[string]any{
		"chatlink":  with(chatlinkFlags, map[string]any{"drain-spread": cl.DrainSpread}),
		"services":  with(servicesFlags, pusherFlags),
		"cdnpusher": pusherFlags,
		"dev":       with(chatlinkFlags, servicesFlags),
	}
	for cmd, flags := range want {
		fs := configured(t, cmd)
		for name, v := range flags {
			f := fs.Lookup(name)
			if f == nil {
				t.Errorf("roomcast %s has no --%s", cmd, name)
				continue
			}
			if got, def := f.Value.String(), fmt.Sprint(v); got != def || f.DefValue != def {
				t.Errorf("roomcast %s --%s defaults to %s (help: %s), the component to %s", cmd, name, got, f.DefValue, def)
			}
		}
	}
}

func with(a, b map[string]any) map[string]any {
	out := map[string]any{}
	for _, m := range []map[string]any{a, b} {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// TestFlagsZeroMeansNone: a limit flag's documented 0 (none) reaches the component as none,
// not as the component's default, which is what a zero field means to it.
func TestFlagsZeroMeansNone(t *testing.T) {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	var c chatlink.Config
	var perKey ratelimit.Limit
	finish := bindChatLinkFlags(fs, &c)
	bindAPILimitFlag(fs, &perKey)
	if err := fs.Parse([]string{"--limit-sends-per-conn", "0", "--limit-connections-per-ip", "0", "--login-concurrency", "0", "--limit-api-calls-per-key", "0"}); err != nil {
		t.Fatal(err)
	}
	finish()
	if c.Limits.SendsPerConn != ratelimit.Unlimited || c.Limits.ConnectionsPerIP >= 0 || c.Limits.LoginConcurrency >= 0 || perKey != ratelimit.Unlimited {
		t.Fatalf("limits after 0s: %+v, API %v: want sends per connection, connections per address, login concurrency and API calls off", c.Limits, perKey)
	}
}
