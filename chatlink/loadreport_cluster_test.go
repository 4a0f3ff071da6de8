package chatlink_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

// TestLoadReportCountsLanes: a node's load report carries its deliveries and drops per lane,
// the same counts its /metrics shows. Two members of a room with a normal budget of one
// message a second get a critical message each (delivered) and a burst of normal and bulk
// messages, most of which the budget leaves out.
func TestLoadReportCountsLanes(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	node := c.Nodes[0]
	putSettings(t, c, "lanes", `{"normal_budget":1}`)
	for i := range 2 {
		cl := testkit.DialTCP(t, node.TCPAddr())
		cl.Login(testcluster.Token(t, fmt.Sprintf("u%d", i), "lanes"))
	}
	apiSend(t, c, "lanes", `{"body":"c","lane":"critical"}`)
	for i := range 6 {
		apiSend(t, c, "lanes", fmt.Sprintf(`{"body":"n%d","lane":"normal"}`, i))
		apiSend(t, c, "lanes", fmt.Sprintf(`{"body":"b%d","lane":"bulk"}`, i))
	}

	nc, err := nats.Connect(c.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	reports := make(chan *buspb.LoadReport, 16)
	sub, err := nc.Subscribe(bus.SubjectLoad, func(m *nats.Msg) {
		var r buspb.LoadReport
		if proto.Unmarshal(m.Data, &r) == nil {
			select {
			case reports <- &r:
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	metric := func(name, lane, reason string) int64 {
		series := name + `{lane="` + lane + `",node="` + node.Name() + `"`
		if reason != "" {
			series = name + `{lane="` + lane + `",node="` + node.Name() + `",reason="` + reason + `"`
		}
		return int64(metricValue(t, c, series+"}"))
	}
	var last *buspb.LoadReport
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		select {
		case last = <-reports:
		case <-time.After(2 * time.Second):
			return fmt.Errorf("no load report")
		}
		if len(last.Lanes) != 3 {
			return fmt.Errorf("report lanes %v, want critical, normal, bulk", last.Lanes)
		}
		var budgetDrops int64
		for i, lc := range last.Lanes {
			name := [...]string{"critical", "normal", "bulk"}[i]
			if lc.Lane != clientpb.Lane(i+1) {
				return fmt.Errorf("report lane %d is %v, want %s", i, lc.Lane, name)
			}
			want := &buspb.LaneCounters{
				Lane:             lc.Lane,
				Deliveries:       metric("roomcast_chatlink_deliveries_total", name, ""),
				DropsBudget:      metric("roomcast_chatlink_drops_total", name, "budget"),
				DropsFlowControl: metric("roomcast_chatlink_drops_total", name, "flow_control"),
				DropsSlowReader:  metric("roomcast_chatlink_drops_total", name, "slow_reader"),
			}
			if !proto.Equal(lc, want) {
				return fmt.Errorf("report's %s lane %v, /metrics %v", name, lc, want)
			}
			budgetDrops += lc.DropsBudget
		}
		if last.Lanes[0].Deliveries != 2 || budgetDrops == 0 || last.Lanes[1].Deliveries+last.Lanes[2].Deliveries == 0 {
			return fmt.Errorf("report lanes %v, want 2 critical deliveries, some normal or bulk, and budget drops", last.Lanes)
		}
		return nil
	})
}
