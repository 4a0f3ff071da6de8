package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
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

// The files of deploy/ agree with the binary: the NATS configs parse as the nats-server we
// build against reads them, every roomcast command line, config file and ROOMCAST_* variable is
// one the binary takes, and the ports of units, probes and manifests are the roles' own.

const deployConfig = "/etc/roomcast/roomcast.yaml" // where the units and manifests mount deploy/roomcast.yaml

func portOf(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	return port
}

// checkEnvNames fails unless every name is the variable of a flag of fs, or its _FILE form.
func checkEnvNames(t *testing.T, what string, fs *flag.FlagSet, names []string) {
	t.Helper()
	for _, name := range names {
		known := false
		fs.VisitAll(func(f *flag.Flag) {
			known = known || name == envName(f.Name) || name == envName(f.Name)+"_FILE"
		})
		if !known {
			t.Errorf("%s: $%s is no flag of roomcast %s", what, name, fs.Name())
		}
	}
}

func TestDeployNATS(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("../../deploy/nats/nats-*.conf")
	if len(files) != 3 {
		t.Fatalf("deploy/nats has %d server configs, want 3", len(files))
	}
	var routes []string
	for i, file := range files {
		opts, err := server.ProcessConfigFile(file)
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("nats-%d", i+1)
		if !opts.JetStream || opts.ServerName != name || opts.Port != 4222 || opts.Cluster.Port != 6222 || len(opts.Routes) != 3 || opts.LameDuckDuration <= 0 {
			t.Errorf("%s: jetstream %v name %q port %d cluster port %d routes %d lame duck %v", file, opts.JetStream, opts.ServerName, opts.Port, opts.Cluster.Port, len(opts.Routes), opts.LameDuckDuration)
		}
		routes = routes[:0]
		for _, r := range opts.Routes {
			routes = append(routes, r.Hostname())
		}
	}
	// The roles' --nats names the same servers, on the client port.
	cf, err := readConfigFile("../../deploy/roomcast.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{"chatlink", "services", "cdnpusher"} {
		var hosts []string
		for u := range strings.SplitSeq(cf.sections[role]["nats"].values[0], ",") {
			pu, err := url.Parse(u)
			if err != nil || pu.Port() != "4222" {
				t.Errorf("%s: --nats %s is not nats://HOST:4222", role, u)
				continue
			}
			hosts = append(hosts, pu.Hostname())
		}
		if !slices.Equal(hosts, routes) {
			t.Errorf("%s: --nats names %v, the cluster is %v", role, hosts, routes)
		}
	}
}

// unit is a systemd unit's [Service] settings, each key's values in order.
func readUnit(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "", strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: %q is not KEY=VALUE", path, line)
			}
			out[section+"."+k] = append(out[section+"."+k], v)
		}
	}
	return out
}

// TestDeploySystemd runs each unit's command line as systemd would give it (its credentials,
// its environment, deploy/roomcast.yaml) with --check-config. Not parallel: it sets the
// environment.
func TestDeploySystemd(t *testing.T) {
	config, _ := filepath.Abs("../../deploy/roomcast.yaml")
	units, _ := filepath.Glob("../../deploy/systemd/roomcast-*.service")
	if len(units) != 3 {
		t.Fatalf("deploy/systemd has %d roomcast units, want 3", len(units))
	}
	hostEnv := regexp.MustCompile(`^#\s+(ROOMCAST_[A-Z_]+)=`)
	for _, path := range units {
		t.Run(filepath.Base(path), func(t *testing.T) {
			u := readUnit(t, path)
			exec := strings.Fields(u["Service.ExecStart"][0])
			if exec[0] != "/usr/local/bin/roomcast" {
				t.Fatalf("ExecStart runs %s", exec[0])
			}
			args := exec[1:]
			for i, a := range args {
				if a == deployConfig {
					args[i] = config
				}
			}
			creds := t.TempDir()
			for _, c := range u["Service.LoadCredential"] {
				name, _, _ := strings.Cut(c, ":")
				if err := os.WriteFile(filepath.Join(creds, name), []byte("demo=x\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			var names []string
			for _, e := range u["Service.Environment"] {
				for assign := range strings.FieldsSeq(e) {
					k, v, _ := strings.Cut(assign, "=")
					t.Setenv(k, strings.ReplaceAll(v, "%d", creds))
					names = append(names, k)
				}
			}
			// The variables the unit's comment asks for in its EnvironmentFile.
			body, _ := os.ReadFile(path)
			for line := range strings.Lines(string(body)) {
				if m := hostEnv.FindStringSubmatch(line); m != nil {
					names = append(names, m[1])
				}
			}
			fs := configured(t, args[0], args[1:]...)
			checkEnvNames(t, path, fs, names)
			if fs.Name() == "chatlink" {
				spread, _ := time.ParseDuration(fs.Lookup("drain-spread").Value.String())
				stop, err := time.ParseDuration(u["Service.TimeoutStopSec"][0] + "s")
				if err != nil || stop <= spread {
					t.Errorf("TimeoutStopSec %v does not leave the drain its --drain-spread %v", stop, spread)
				}
			}
		})
	}
	nats := readUnit(t, "../../deploy/systemd/nats.service")
	if got := nats["Service.KillSignal"]; !slices.Equal(got, []string{"SIGUSR2"}) {
		t.Errorf("nats.service stops with %v, want lame duck mode's SIGUSR2", got)
	}
}

// TestDeployKubernetes checks deploy/kubernetes/roomcast.yaml: its ConfigMap is a config the
// binary takes, each workload's arguments and environment too, and the ports its probes and
// Service name are the roles' listeners. Not parallel: it sets the environment.
func TestDeployKubernetes(t *testing.T) {
	checkKubernetes(t, "../../deploy/kubernetes/roomcast.yaml", "services", "chatlink", "cdnpusher")
}

// checkKubernetes checks a manifest as TestDeployKubernetes says, and that its workloads run
// each of roles and no other. Workloads of another image than roomcast's (NATS) are left to
// their own checks.
func checkKubernetes(t *testing.T, path string, roles ...string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	type probe struct {
		HTTPGet struct{ Path, Port string } `yaml:"httpGet"`
	}
	type container struct {
		Image string
		Args  []string
		Env   []struct {
			Name      string
			Value     string
			ValueFrom map[string]any `yaml:"valueFrom"`
		}
		Ports []struct {
			Name          string
			ContainerPort int `yaml:"containerPort"`
		}
		ReadinessProbe probe `yaml:"readinessProbe"`
		LivenessProbe  probe `yaml:"livenessProbe"`
		Lifecycle      struct {
			PreStop struct {
				Exec struct{ Command []string }
			} `yaml:"preStop"`
		}
	}
	type object struct {
		Kind     string
		Metadata struct{ Name string }
		Data     map[string]string
		Spec     struct {
			Ports []struct {
				TargetPort string `yaml:"targetPort"`
			}
			Template struct {
				Spec struct {
					TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
					Containers                    []container
				}
			}
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var objs []object
	for {
		var o object
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o)
	}
	dir := t.TempDir()
	config := filepath.Join(dir, "roomcast.yaml")
	secrets := filepath.Join(dir, "secrets")
	if err := os.Mkdir(secrets, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"token-secrets", "api-keys"} {
		if err := os.WriteFile(filepath.Join(secrets, s), []byte("demo=x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	containerPorts := map[string]map[string]int{} // workload -> port name -> port
	ran := map[string]bool{}
	for _, o := range objs {
		if _, ok := o.Data["roomcast.yaml"]; ok && o.Kind == "ConfigMap" {
			if err := os.WriteFile(config, []byte(o.Data["roomcast.yaml"]), 0o600); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if code := run(context.Background(), []string{"config", "check", config}, io.Discard, &out); code != 0 {
				t.Fatalf("the ConfigMap's roomcast.yaml: %s", out.String())
			}
		}
	}
	for _, o := range objs {
		if o.Kind != "Deployment" && o.Kind != "StatefulSet" {
			continue
		}
		c := o.Spec.Template.Spec.Containers[0]
		if !strings.HasPrefix(c.Image, "registry.example.com/roomcast:") {
			continue
		}
		t.Run(o.Metadata.Name, func(t *testing.T) {
			args := slices.Clone(c.Args)
			for i, a := range args {
				if a == deployConfig {
					args[i] = config
				}
			}
			env := map[string]string{}
			var names []string
			for _, e := range c.Env {
				v := e.Value
				switch {
				case e.ValueFrom["fieldRef"] != nil:
					v = "10.0.0.9" // status.podIP, status.hostIP; metadata.name is a name as good
				case e.ValueFrom["secretKeyRef"] != nil:
					v = "secret"
				}
				v = regexp.MustCompile(`\$\((\w+)\)`).ReplaceAllStringFunc(v, func(ref string) string { return env[ref[2:len(ref)-1]] })
				v = strings.Replace(v, "/etc/roomcast/secrets", secrets, 1)
				env[e.Name] = v
				if strings.HasPrefix(e.Name, envPrefix) {
					t.Setenv(e.Name, v)
					names = append(names, e.Name)
				}
			}
			fs := configured(t, args[0], args[1:]...)
			ran[fs.Name()] = true
			checkEnvNames(t, o.Metadata.Name, fs, names)
			ports := map[string]int{}
			for _, p := range c.Ports {
				ports[p.Name] = p.ContainerPort
			}
			containerPorts[o.Metadata.Name] = ports
			// Each named port is the listener of the flag of that role.
			listeners := map[string]string{"ops": "ops", "ws": "ws", "tcp": "tcp", "http": "listen", "grpc": "grpc-listen"}
			for name, port := range ports {
				f := fs.Lookup(listeners[name])
				if f == nil {
					t.Errorf("port %s names no listener of roomcast %s", name, fs.Name())
					continue
				}
				if got := portOf(t, f.Value.String()); got != strconv.Itoa(port) {
					t.Errorf("port %s is %d, --%s listens on %s", name, port, f.Name, got)
				}
			}
			for _, probe := range []struct{ path, port string }{
				{c.ReadinessProbe.HTTPGet.Path, c.ReadinessProbe.HTTPGet.Port}, {c.LivenessProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Port},
			} {
				if probe.port != "ops" || (probe.path != "/readyz" && probe.path != "/livez") {
					t.Errorf("a probe asks %s on port %s, want /readyz or /livez on ops", probe.path, probe.port)
				}
			}
			if fs.Name() == "chatlink" {
				grace := time.Duration(o.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
				spread, _ := time.ParseDuration(fs.Lookup("drain-spread").Value.String())
				if grace <= spread {
					t.Errorf("terminationGracePeriodSeconds %v does not leave the drain its --drain-spread %v", grace, spread)
				}
				// The preStop hook drains this node (its name from the container's
				// environment, set above) within the grace period.
				hook := c.Lifecycle.PreStop.Exec.Command
				if len(hook) < 2 || hook[0] != "roomcast" || hook[1] != "drain" {
					t.Fatalf("preStop %q, want roomcast drain", hook)
				}
				drain := configured(t, hook[1], hook[2:]...)
				if node := drain.Lookup("node").Value.String(); node == "" || node != env["ROOMCAST_NODE"] {
					t.Errorf("preStop drains node %q, the container is node %q", node, env["ROOMCAST_NODE"])
				}
				hookSpread, _ := time.ParseDuration(drain.Lookup("spread").Value.String())
				if hookSpread <= 0 || grace <= hookSpread {
					t.Errorf("preStop drains over %v: want a spread within terminationGracePeriodSeconds %v", hookSpread, grace)
				}
			}
		})
	}
	for _, want := range roles {
		if !ran[want] {
			t.Errorf("no workload runs roomcast %s", want)
		}
		delete(ran, want)
	}
	for role := range ran {
		t.Errorf("a workload runs roomcast %s, which this manifest should not", role)
	}
	for _, o := range objs {
		if _, roomcast := containerPorts[o.Metadata.Name]; o.Kind == "Service" && roomcast {
			for _, p := range o.Spec.Ports {
				if _, ok := containerPorts[o.Metadata.Name][p.TargetPort]; !ok {
					t.Errorf("Service %s targets port %q, which its workload does not name", o.Metadata.Name, p.TargetPort)
				}
			}
		}
	}
}

// startDeployNATS starts the three NATS servers of deploy/nats/ in this process, each from its
// file with its addresses moved to free local ports and its store to a temporary directory,
// and returns their client URLs once JetStream answers.
func startDeployNATS(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob("../../deploy/nats/nats-*.conf")
	routes := make([]*url.URL, len(files))
	clients := make([]string, len(files))
	for i := range files {
		routes[i] = &url.URL{Scheme: "nats-route", Host: testkit.FreeAddr(t)}
		clients[i] = "nats://" + testkit.FreeAddr(t)
	}
	for i, file := range files {
		opts, err := server.ProcessConfigFile(file)
		if err != nil {
			t.Fatal(err)
		}
		pu, _ := url.Parse(clients[i])
		opts.Host, opts.Port = "127.0.0.1", mustAtoi(t, pu.Port())
		opts.Cluster.Host, opts.Cluster.Port = "127.0.0.1", mustAtoi(t, routes[i].Port())
		opts.Routes = routes
		opts.HTTPPort = 0
		opts.StoreDir = t.TempDir()
		opts.NoLog, opts.NoSigs = true, true
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatalf("%s: not ready", file)
		}
	}
	procs.WaitJetStream(t, clients)
	return clients
}

// startDeployNATSProcesses runs deploy/nats/'s three files as they are written, in three
// nats-server processes (internal/testkit/procs), and returns their client URLs once JetStream
// answers.
func startDeployNATSProcesses(t *testing.T) []string {
	t.Helper()
	bin := procs.BuildNATSServer(t, t.TempDir())
	return procs.StartNATS(t, bin, "../../deploy").URLs
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestReferenceDeployment runs the reference deployment of docs/operations.md in one process:
// a 3-node JetStream cluster from deploy/nats/, the services and a ChatLink from
// deploy/roomcast.yaml, with only this host's addresses and the secrets as flags; a room
// created through the API; the probe through it. The buckets have the file's 3 replicas and
// every role is ready. With -short the NATS servers run in this process; without, as
// nats-server processes.
func TestReferenceDeployment(t *testing.T) {
	t.Parallel()
	startNATS := startDeployNATSProcesses
	if testing.Short() {
		startNATS = startDeployNATS
	}
	natsURL := strings.Join(startNATS(t), ",") // about 5s: the JetStream cluster elects its leader
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	config := "../../deploy/roomcast.yaml"
	type role struct {
		done chan int
		out  *syncBuffer
	}
	start := func(args ...string) role {
		r := role{done: make(chan int, 1), out: &syncBuffer{}}
		go func() { r.done <- run(ctx, args, r.out, r.out) }()
		return r
	}
	api, servicesOps, edgeOps := testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)
	services := start("services", "--config", config, "--nats", natsURL, "--api-key", "k1=demo",
		"--listen", api, "--grpc-listen", "127.0.0.1:0", "--ops", servicesOps)
	edge := start("chatlink", "--config", config, "--nats", natsURL, "--node", "edge-1", "--secret", "demo=s3cr3t",
		"--tls-cert", "", "--tls-key", "", "--ws", testkit.FreeAddr(t), "--tcp", testkit.FreeAddr(t), "--ops", edgeOps)
	for _, ops := range []string{servicesOps, edgeOps} {
		testkit.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
			resp, err := http.Get("http://" + ops + "/readyz")
			if err != nil {
				return fmt.Errorf("%v\nservices: %s\nchatlink: %s", err, services.out.String(), edge.out.String())
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("%s/readyz: %s", ops, resp.Status)
			}
			return nil
		})
	}
	// require-created is on in the file: the probe's room must exist.
	req, _ := http.NewRequest("POST", "http://"+api+"/v1/rooms", strings.NewReader(`{"room":"probe"}`))
	req.Header.Set("Authorization", "Bearer k1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("CreateRoom: %s", resp.Status)
	}
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		resp, err := http.Get("http://" + api + "/v1/dispatch")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(body), "edge-1") {
			return fmt.Errorf("dispatch: %s", body)
		}
		return nil
	})
	var out, errOut bytes.Buffer
	if code := run(ctx, []string{"probe", "--dispatcher", "http://" + api, "--app", "demo", "--secret", "s3cr3t",
		"--room", "probe", "--clients", "4", "--messages", "10"}, &out, &errOut); code != 0 {
		t.Fatalf("probe exit %d: %s%s", code, out.String(), errOut.String())
	}

	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	// Every bucket and stream of the deployment has the file's replication.
	streams := js.ListStreams(context.Background())
	n := 0
	for info := range streams.Info() {
		n++
		if r := info.Config.Replicas; r != 3 {
			t.Errorf("stream %s has %d replicas, want deploy/roomcast.yaml's kv-replicas 3", info.Config.Name, r)
		}
	}
	if streams.Err() != nil || n == 0 {
		t.Errorf("listed %d streams: %v", n, streams.Err())
	}
	cancel()
	for name, r := range map[string]role{"services": services, "chatlink": edge} {
		select {
		case code := <-r.done:
			if code != 0 {
				t.Errorf("%s exited %d:\n%s", name, code, r.out.String())
			}
		case <-time.After(40 * time.Second):
			t.Errorf("%s did not stop", name)
		}
	}
}
