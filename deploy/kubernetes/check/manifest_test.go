package check

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	yamlv3 "go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	v1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// The manifests, each with how many objects of each kind of workload and disruption budget it
// holds: the one-region deployment, and the three regions of the reference deployment of
// docs/regions.md (NATS runs in each region's cluster there, a StatefulSet; the services and
// the CDN pushers in the home region only).
var manifests = []struct {
	path  string
	kinds map[string]int
}{
	{"../roomcast.yaml", map[string]int{"Deployment": 2, "StatefulSet": 1, "PodDisruptionBudget": 3}},
	{"../../regions/kubernetes/eu.yaml", map[string]int{"Deployment": 2, "StatefulSet": 2, "PodDisruptionBudget": 4}},
	{"../../regions/kubernetes/na.yaml", map[string]int{"Deployment": 0, "StatefulSet": 2, "PodDisruptionBudget": 2}},
	{"../../regions/kubernetes/as.yaml", map[string]int{"Deployment": 0, "StatefulSet": 2, "PodDisruptionBudget": 2}},
}

// documents splits a manifest into its YAML documents, each as its own bytes.
func documents(t *testing.T, manifest string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	dec := yamlv3.NewDecoder(bytes.NewReader(data))
	var docs [][]byte
	for {
		var node yamlv3.Node
		if err := dec.Decode(&node); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		b, err := yamlv3.Marshal(&node)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, b)
	}
	return docs
}

// workload is what the checks read of a Deployment or a StatefulSet.
type workload struct {
	name     string
	selector *v1.LabelSelector
	template corev1.PodTemplateSpec
}

// TestManifest decodes every object of each manifest strictly into its API type, and checks
// what the API server would only find at run time: selectors that select their pods, probes,
// hooks and Services that name ports the containers have, and a PodDisruptionBudget for every
// workload.
func TestManifest(t *testing.T) {
	for _, m := range manifests {
		t.Run(filepath.Base(m.path), func(t *testing.T) { checkManifest(t, m.path, m.kinds) })
	}
}

func checkManifest(t *testing.T, manifest string, want map[string]int) {
	var workloads []workload
	var services []corev1.Service
	var budgets []policyv1.PodDisruptionBudget
	kinds := map[string]int{}
	for i, doc := range documents(t, manifest) {
		var meta v1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("document %d: %v", i+1, err)
		}
		kinds[meta.Kind]++
		var obj any
		switch meta.APIVersion + " " + meta.Kind {
		case "v1 ConfigMap":
			obj = &corev1.ConfigMap{}
		case "v1 Service":
			obj = &corev1.Service{}
		case "apps/v1 Deployment":
			obj = &appsv1.Deployment{}
		case "apps/v1 StatefulSet":
			obj = &appsv1.StatefulSet{}
		case "policy/v1 PodDisruptionBudget":
			obj = &policyv1.PodDisruptionBudget{}
		default:
			t.Fatalf("document %d: %s %s: no check for this kind", i+1, meta.APIVersion, meta.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Errorf("document %d (%s): %v", i+1, meta.Kind, err)
			continue
		}
		switch o := obj.(type) {
		case *appsv1.Deployment:
			workloads = append(workloads, workload{o.Name, o.Spec.Selector, o.Spec.Template})
		case *appsv1.StatefulSet:
			workloads = append(workloads, workload{o.Name, o.Spec.Selector, o.Spec.Template})
		case *corev1.Service:
			services = append(services, *o)
		case *policyv1.PodDisruptionBudget:
			budgets = append(budgets, *o)
		}
	}
	for kind, n := range want {
		if kinds[kind] != n {
			t.Errorf("%d objects of kind %s, want %d (all: %v)", kinds[kind], kind, n, kinds)
		}
	}
	podLabels := func(w workload) labels.Set { return labels.Set(w.template.Labels) }
	for _, w := range workloads {
		sel, err := v1.LabelSelectorAsSelector(w.selector)
		if err != nil || sel.Empty() || !sel.Matches(podLabels(w)) {
			t.Errorf("%s: selector %v does not select its pods (%v): %v", w.name, w.selector, w.template.Labels, err)
		}
		for _, c := range w.template.Spec.Containers {
			ports := map[string]bool{}
			for _, p := range c.Ports {
				ports[p.Name] = true
			}
			for what, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe} {
				if p == nil {
					if what != "startup" {
						t.Errorf("%s/%s: no %s probe", w.name, c.Name, what)
					}
					continue
				}
				if p.HTTPGet == nil || !ports[p.HTTPGet.Port.StrVal] {
					t.Errorf("%s/%s: the %s probe names no port of the container", w.name, c.Name, what)
				}
			}
			if c.Image == "" {
				t.Errorf("%s/%s: no image", w.name, c.Name)
			}
		}
		covered := 0
		for _, b := range budgets {
			if sel, err := v1.LabelSelectorAsSelector(b.Spec.Selector); err == nil && sel.Matches(podLabels(w)) {
				covered++
			}
		}
		if covered != 1 {
			t.Errorf("%s: %d PodDisruptionBudgets select its pods, want 1", w.name, covered)
		}
	}
	for _, s := range services {
		found := false
		for _, w := range workloads {
			if labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels(w)) {
				found = true
				for _, p := range s.Spec.Ports {
					named := false
					for _, cp := range w.template.Spec.Containers[0].Ports {
						named = named || cp.Name == p.TargetPort.StrVal
					}
					if !named {
						t.Errorf("Service %s: targetPort %q is no port of %s", s.Name, p.TargetPort.String(), w.name)
					}
				}
			}
		}
		if !found {
			t.Errorf("Service %s selects no workload's pods", s.Name)
		}
	}
}

// TestStrict checks the check: a field the API does not have fails.
func TestStrict(t *testing.T) {
	doc := []byte("apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: x}\nspec:\n  maxUnavailabel: 1\n")
	if err := yaml.UnmarshalStrict(doc, &policyv1.PodDisruptionBudget{}); err == nil {
		t.Fatal("a misspelled field decoded without an error")
	}
}
