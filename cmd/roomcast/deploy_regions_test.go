package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"

	"roomcast/internal/testkit"
	"roomcast/internal/testkit/procs"
)

// The three regions of deploy/regions/ (docs/regions.md, "Deploying three regions"): the home
// region first, each with the region label of its ChatLinks.
var deployRegions = []struct{ name, label string }{{"eu", "EU/DE"}, {"na", "NA/US"}, {"as", "AS/SG"}}

// regionManifest is what the checks read of a region's Kubernetes manifest.
type regionManifest struct {
	natsConf     string            // the ConfigMap nats-config's nats.conf
	roomcastConf string            // the ConfigMap roomcast-config's roomcast.yaml
	statefulSets map[string]k8sSet // by name
}

type k8sSet struct {
	Spec struct {
		ServiceName string `yaml:"serviceName"`
		Replicas    int
		Template    struct {
			Spec struct {
				Containers []struct {
					Env []struct {
						Name  string
						Value string
					}
					ReadinessProbe k8sProbe `yaml:"readinessProbe"`
					LivenessProbe  k8sProbe `yaml:"livenessProbe"`
					StartupProbe   k8sProbe `yaml:"startupProbe"`
					Lifecycle      struct {
						PreStop struct {
							Exec struct{ Command []string }
						} `yaml:"preStop"`
					}
				}
			}
		}
	}
}

type k8sProbe struct {
	HTTPGet struct{ Path, Port string } `yaml:"httpGet"`
}

func readRegionManifest(t *testing.T, region string) regionManifest {
	t.Helper()
	data, err := os.ReadFile("../../deploy/regions/kubernetes/" + region + ".yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := regionManifest{statefulSets: map[string]k8sSet{}}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var node yaml.Node
		if err := dec.Decode(&node); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		var head struct {
			Kind     string
			Metadata struct{ Name string }
			Data     map[string]string
		}
		if err := node.Decode(&head); err != nil {
			t.Fatal(err)
		}
		switch head.Kind {
		case "ConfigMap":
			m.natsConf += head.Data["nats.conf"]
			m.roomcastConf += head.Data["roomcast.yaml"]
		case "StatefulSet":
			var s k8sSet
			if err := node.Decode(&s); err != nil {
				t.Fatal(err)
			}
			m.statefulSets[head.Metadata.Name] = s
		}
	}
	return m
}

func (s k8sSet) env(name string) string {
	for _, e := range s.Spec.Template.Spec.Containers[0].Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// TestDeployRegionsNATS parses each region's NATS config as the nats-server we build against
// reads it (its server name from the environment, as the StatefulSet gives it), and checks that
// together they are one supercluster: each region a cluster of its own name, routed to the
// three pods of its StatefulSet, with a gateway of that name to every other region at the
// address that region advertises, and JetStream in the home region only (docs/regions.md). Each
// region's manifest carries the file as it is. Not parallel: it sets the environment.
func TestDeployRegionsNATS(t *testing.T) {
	t.Setenv("SERVER_NAME", "nats-1")
	opts := map[string]*server.Options{}
	for _, r := range deployRegions {
		o, err := server.ProcessConfigFile("../../deploy/regions/nats/" + r.name + ".conf")
		if err != nil {
			t.Fatal(err)
		}
		opts[r.name] = o
	}
	home := deployRegions[0].name
	for _, r := range deployRegions {
		o := opts[r.name]
		m := readRegionManifest(t, r.name)
		file, _ := os.ReadFile("../../deploy/regions/nats/" + r.name + ".conf")
		if m.natsConf != string(file) {
			t.Errorf("%s: the ConfigMap nats-config's nats.conf is not deploy/regions/nats/%s.conf", r.name, r.name)
		}
		if o.ServerName != "nats-1" {
			t.Errorf("%s: server_name %q, want $SERVER_NAME's", r.name, o.ServerName)
		}
		if o.Cluster.Name != r.name || o.Gateway.Name != r.name {
			t.Errorf("%s: cluster %q, gateway %q: want both named after the region", r.name, o.Cluster.Name, o.Gateway.Name)
		}
		if o.Port != 4222 || o.Cluster.Port != 6222 || o.Gateway.Port != 7222 || o.HTTPPort != 8222 {
			t.Errorf("%s: ports client %d, cluster %d, gateway %d, monitoring %d", r.name, o.Port, o.Cluster.Port, o.Gateway.Port, o.HTTPPort)
		}
		if o.JetStream != (r.name == home) {
			t.Errorf("%s: jetstream %v: want it in the home region (%s) only", r.name, o.JetStream, home)
		}
		// The routes are the StatefulSet's pods, through its headless Service.
		nats := m.statefulSets["nats"]
		var routes, pods []string
		for _, u := range o.Routes {
			routes = append(routes, u.Host)
		}
		for i := range nats.Spec.Replicas {
			pods = append(pods, net.JoinHostPort(fmt.Sprintf("nats-%d.%s", i, nats.Spec.ServiceName), "6222"))
		}
		if !slices.Equal(routes, pods) {
			t.Errorf("%s: routes %v, the StatefulSet's pods are %v", r.name, routes, pods)
		}
		// The preStop hook signals the server of the pid file.
		hook := nats.Spec.Template.Spec.Containers[0].Lifecycle.PreStop.Exec.Command
		if o.PidFile == "" || !slices.Contains(hook, "ldm="+o.PidFile) || o.LameDuckDuration <= 0 {
			t.Errorf("%s: preStop %q, pid_file %q, lame duck %v: want the hook to put the server in lame duck mode", r.name, hook, o.PidFile, o.LameDuckDuration)
		}
		// A gateway to each other region, at the address it advertises.
		gateways := map[string][]string{}
		for _, g := range o.Gateway.Gateways {
			for _, u := range g.URLs {
				gateways[g.Name] = append(gateways[g.Name], u.Host)
			}
		}
		var others []string
		for _, other := range deployRegions {
			if other.name == r.name {
				continue
			}
			others = append(others, other.name)
			if want := opts[other.name].Gateway.Advertise; !slices.Equal(gateways[other.name], []string{want}) {
				t.Errorf("%s: gateway to %s at %v, %s advertises %s", r.name, other.name, gateways[other.name], other.name, want)
			}
		}
		if got := slices.Sorted(maps.Keys(gateways)); !slices.Equal(got, slices.Sorted(slices.Values(others))) {
			t.Errorf("%s: gateways to %v, want the other regions %v", r.name, got, others)
		}
	}
	if !t.Failed() {
		startDeployRegions(t, opts)
	}
}

// probePaths returns the HTTP paths of the probes of a region's NATS StatefulSet.
func probePaths(t *testing.T, region string) []string {
	t.Helper()
	c := readRegionManifest(t, region).statefulSets["nats"].Spec.Template.Spec.Containers[0]
	var paths []string
	for _, p := range []k8sProbe{c.ReadinessProbe, c.LivenessProbe, c.StartupProbe} {
		if p.HTTPGet.Port != "monitor" || p.HTTPGet.Path == "" {
			t.Errorf("%s: a NATS probe asks %q on port %q, want the monitoring port", region, p.HTTPGet.Path, p.HTTPGet.Port)
		}
		paths = append(paths, p.HTTPGet.Path)
	}
	return paths
}

// startDeployRegions runs the regions' NATS configs as one supercluster in this process, three
// servers a region as the StatefulSets run them, each config with only its addresses moved to
// free local ports (a region's gateway address, its load balancer's, is its first server's
// here) and its store to a temporary directory. It checks that every server has a gateway to
// each other region, that its StatefulSet's probes answer 200 on its monitoring port, and that a client of a far region reaches JetStream in the home region: it
// creates a KV bucket of 3 replicas, as the roles do with kv-replicas 3.
func startDeployRegions(t *testing.T, parsed map[string]*server.Options) {
	t.Helper()
	// The routes' and gateways' ports are picked before the servers bind them, and a test of
	// another package may take one in between (CI: "bind: address already in use"): then every
	// server is stopped and the supercluster started again on other ports.
	var (
		servers []*server.Server
		monitor map[*server.Server]string
		region  map[*server.Server]string
		clients map[string][]string
		err     error
	)
	for attempt := 1; ; attempt++ {
		servers, monitor, region, clients, err = runDeployRegions(t, parsed)
		if err == nil {
			break
		}
		for _, s := range servers {
			s.Shutdown()
			s.WaitForShutdown()
		}
		if !strings.Contains(err.Error(), "address already in use") || attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("attempt %d: %v; again on other ports", attempt, err)
	}
	for _, s := range servers {
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	}
	testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		for _, s := range servers {
			gz, err := s.Gatewayz(nil)
			if err != nil {
				return err
			}
			var to []string
			for name, g := range gz.OutboundGateways {
				if g.Connection != nil {
					to = append(to, name)
				}
			}
			if len(to) != len(deployRegions)-1 {
				return fmt.Errorf("%s (gateway %s) has gateways to %v, want every other region", s.Name(), gz.Name, to)
			}
		}
		return nil
	})
	paths := map[string][]string{}
	for _, r := range deployRegions {
		paths[r.name] = probePaths(t, r.name)
	}
	testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		for _, s := range servers {
			for _, path := range paths[region[s]] {
				resp, err := http.Get("http://" + monitor[s] + path)
				if err != nil {
					return err
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("%s %s: %s %s", s.Name(), path, resp.Status, body)
				}
			}
		}
		return nil
	})
	far := "nats://" + strings.Join(clients[deployRegions[1].name], ",nats://")
	procs.WaitJetStream(t, []string{far})
	nc, err := nats.Connect(far)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "regions", Replicas: 3})
	if err != nil {
		t.Fatalf("a KV bucket of 3 replicas from %s: %v", deployRegions[1].name, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	info := st.(*jetstream.KeyValueBucketStatus).StreamInfo()
	if got := info.Cluster.Name; got != deployRegions[0].name {
		t.Errorf("the bucket is in %q, want the home region %q", got, deployRegions[0].name)
	}
}

// runDeployRegions starts the servers of startDeployRegions and waits until each accepts
// connections: it returns them with their monitoring addresses, their regions and each
// region's client addresses, or the first server's failure (with the servers it started).
func runDeployRegions(t *testing.T, parsed map[string]*server.Options) ([]*server.Server, map[*server.Server]string, map[*server.Server]string, map[string][]string, error) {
	t.Helper()
	const perRegion = 3
	type addrs struct{ route, gateway []string }
	at := map[string]*addrs{}
	for _, r := range deployRegions {
		a := &addrs{}
		for range perRegion {
			a.route = append(a.route, testkit.FreeAddr(t))
			a.gateway = append(a.gateway, testkit.FreeAddr(t))
		}
		at[r.name] = a
	}
	hostPort := func(addr string) (string, int) {
		host, port, _ := net.SplitHostPort(addr)
		return host, mustAtoi(t, port)
	}
	var servers []*server.Server
	monitor := map[*server.Server]string{} // the monitoring port's address
	region := map[*server.Server]string{}
	clients := map[string][]string{}
	for _, r := range deployRegions {
		a := at[r.name]
		for i := range perRegion {
			o := parsed[r.name].Clone()
			o.ServerName = fmt.Sprintf("nats-%s-%d", r.name, i)
			o.Host, o.Port = "127.0.0.1", server.RANDOM_PORT
			o.Cluster.Host, o.Cluster.Port = hostPort(a.route[i])
			o.Routes = nil
			for _, route := range a.route {
				o.Routes = append(o.Routes, &url.URL{Scheme: "nats-route", Host: route})
			}
			o.Gateway.Host, o.Gateway.Port = hostPort(a.gateway[i])
			o.Gateway.Advertise = a.gateway[0]
			for _, g := range o.Gateway.Gateways {
				g.URLs = []*url.URL{{Scheme: "nats", Host: at[g.Name].gateway[0]}}
			}
			o.HTTPHost, o.HTTPPort = "127.0.0.1", server.RANDOM_PORT
			o.PidFile = ""
			o.StoreDir = t.TempDir()
			o.NoLog, o.NoSigs = true, true
			s, err := server.NewServer(o)
			if err != nil {
				return servers, nil, nil, nil, fmt.Errorf("%s: %w", o.ServerName, err)
			}
			go s.Start()
			servers = append(servers, s)
			region[s] = r.name
		}
	}
	for _, s := range servers {
		if !s.ReadyForConnections(20 * time.Second) {
			// Healthz names why: a port it could not bind, say.
			return servers, nil, nil, nil, fmt.Errorf("%s not ready: %s", s.Name(), s.Healthz(nil).Error)
		}
		monitor[s] = s.MonitorAddr().String()
		clients[region[s]] = append(clients[region[s]], s.Addr().String())
	}
	return servers, monitor, region, clients, nil
}

// TestDeployRegionsRoomcast checks the roles of deploy/regions/kubernetes/: the home region runs
// the services, the ChatLinks and the CDN pushers, the far regions ChatLinks only (each
// manifest as TestDeployKubernetes checks one); every region's ChatLinks connect to the region's
// own NATS and carry its region label and node names of their own; and the dispatcher has a
// near-region list for every region, naming the other two. Not parallel: it sets the
// environment.
func TestDeployRegionsRoomcast(t *testing.T) {
	for i, r := range deployRegions {
		t.Run(r.name, func(t *testing.T) {
			roles := []string{"chatlink"}
			if i == 0 {
				roles = []string{"services", "chatlink", "cdnpusher"}
			}
			checkKubernetes(t, "../../deploy/regions/kubernetes/"+r.name+".yaml", roles...)
			m := readRegionManifest(t, r.name)
			cl := m.statefulSets["roomcast-chatlink"]
			if got := cl.env("ROOMCAST_REGION"); got != r.label {
				t.Errorf("ChatLinks labelled %q, want %q", got, r.label)
			}
			if got := cl.env("ROOMCAST_NODE"); !strings.HasPrefix(got, r.name+"-") {
				t.Errorf("ChatLinks named %q: want the region's name first, node names being one namespace across the regions", got)
			}
			dir := t.TempDir()
			path := dir + "/roomcast.yaml"
			if err := os.WriteFile(path, []byte(m.roomcastConf), 0o600); err != nil {
				t.Fatal(err)
			}
			cf, err := readConfigFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if got := cf.sections["chatlink"]["nats"].values; !slices.Equal(got, []string{"nats://nats:4222"}) {
				t.Errorf("ChatLinks' --nats %v, want the region's own NATS (the Service nats)", got)
			}
			if i > 0 {
				return
			}
			near := map[string][]string{}
			for _, v := range cf.sections["services"]["near-region"].values {
				k, list, _ := strings.Cut(v, "=")
				near[k] = strings.Split(list, ",")
			}
			for _, r := range deployRegions {
				continent, _, _ := strings.Cut(r.label, "/")
				var others []string
				for _, o := range deployRegions {
					if o != r {
						c, _, _ := strings.Cut(o.label, "/")
						others = append(others, c)
					}
				}
				if got := near[continent]; len(got) != 2 || !slices.Contains(got, others[0]) || !slices.Contains(got, others[1]) {
					t.Errorf("--near-region %s=%v: want the other regions' continents %v, nearest first", continent, got, others)
				}
			}
		})
	}
}
