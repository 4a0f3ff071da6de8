package bigroom

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"roomcast/internal/testkit/procs"
)

func TestMain(m *testing.M) { procs.Main(m) }

// basePort returns a BASE_PORT whose ports the script uses are free (below the ephemeral
// range, so that no outgoing connection takes one meanwhile).
func basePort(t *testing.T, chatlinks int) int {
	for range 50 {
		base := 20000 + 10*rand.IntN(1200)
		ports := []int{base, base + 1, base + 2, base + 3}
		for i := 1; i <= chatlinks; i++ {
			ports = append(ports, base+100+i, base+200+i, base+300+i)
		}
		free := true
		for _, p := range ports {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				free = false
				break
			}
			l.Close()
		}
		if free {
			return base
		}
	}
	t.Fatal("no free ports for the script")
	return 0
}

// TestBigRoomScript runs the script with 300 members over three ChatLinks and three worker
// processes, and checks that every member joined and got every message, and that it reports
// each tier's memory per member.
func TestBigRoomScript(t *testing.T) {
	bin := procs.GetBinaries(t)
	cmd := exec.Command("../../scripts/bigroom.sh")
	cmd.Env = append(os.Environ(), "N=300", "PER_CHATLINK_PLAN=100", "PER_PROCESS=100", "RATE=2", "DURATION=3s",
		"LOGIN_RATE=300", "ROOMCAST="+bin.Roomcast, "NATS_SERVER="+bin.NATSServer, "WORK="+t.TempDir(),
		fmt.Sprintf("BASE_PORT=%d", basePort(t, 3)))
	out, err := cmd.Output()
	var stderr string
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = string(ee.Stderr)
	}
	if err != nil {
		t.Fatalf("bigroom.sh: %v\n%s\n%s", err, out, stderr)
	}
	var res struct {
		Connected, Workers, Published, Expected, Delivered, Lost int64
		Processes                                                []struct{ PID int } `json:"server_processes"`
	}
	var tiers string
	for line := range strings.SplitSeq(string(out), "\n") {
		switch {
		case strings.HasPrefix(line, "{"):
			if err := json.Unmarshal([]byte(line), &res); err != nil {
				t.Fatalf("bench JSON: %v\n%s", err, line)
			}
		case strings.HasPrefix(line, "tiers "):
			tiers = line
		}
	}
	t.Logf("%+v\n%s", res, tiers)
	if res.Connected != 300 || res.Workers != 3 || len(res.Processes) != 2+3 {
		t.Errorf("%d members over %d workers, %d server processes; want 300 over 3, 5 (NATS, services, 3 ChatLinks)",
			res.Connected, res.Workers, len(res.Processes))
	}
	if res.Published != 6 || res.Delivered != res.Expected || res.Expected != 6*300 || res.Lost != 0 {
		t.Errorf("published %d, delivered %d of %d (lost %d); want 6, 1800 of 1800", res.Published, res.Delivered, res.Expected, res.Lost)
	}
	for _, field := range []string{"members=300", "chatlinks=3", "nats_rss_per_member=", "services_rss_per_member=", "chatlinks_rss_per_member="} {
		if !strings.Contains(tiers, field) {
			t.Errorf("tiers line %q lacks %s", tiers, field)
		}
	}
}
