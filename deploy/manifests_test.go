package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// manifests are the typed objects of deploy/kubernetes.
type manifests struct {
	namespaces  []corev1.Namespace
	daemonSets  []appsv1.DaemonSet
	deployments []appsv1.Deployment
	services    []corev1.Service
}

// loadManifests decodes every document of the files strictly into the
// Kubernetes API types: an unknown or misspelt field, a duplicate key or a
// wrong type fails, as `kubectl apply --validate=strict` would.
func loadManifests(t *testing.T, files ...string) manifests {
	t.Helper()
	var m manifests
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
		for i := 0; ; i++ {
			doc, err := r.Read()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			var head struct{ APIVersion, Kind string }
			if err := yaml.Unmarshal(doc, &head); err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			what := fmt.Sprintf("%s document %d (%s)", f, i, head.Kind)
			switch head.APIVersion + " " + head.Kind {
			case "v1 Namespace":
				m.namespaces = append(m.namespaces, strict[corev1.Namespace](t, what, doc))
			case "apps/v1 DaemonSet":
				m.daemonSets = append(m.daemonSets, strict[appsv1.DaemonSet](t, what, doc))
			case "apps/v1 Deployment":
				m.deployments = append(m.deployments, strict[appsv1.Deployment](t, what, doc))
			case "v1 Service":
				m.services = append(m.services, strict[corev1.Service](t, what, doc))
			default:
				t.Fatalf("%s document %d: unexpected %s %s", f, i, head.APIVersion, head.Kind)
			}
		}
	}
	return m
}

// strict decodes doc into a T, failing on unknown fields.
func strict[T any](t *testing.T, what string, doc []byte) T {
	t.Helper()
	var o T
	if err := yaml.UnmarshalStrict(doc, &o); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return o
}

func deployManifests(t *testing.T) manifests {
	return loadManifests(t, "kubernetes/server-daemonset.yaml", "kubernetes/coordinator.yaml")
}

// flagValue is the value after --name in args.
func flagValue(t *testing.T, args []string, name string) string {
	t.Helper()
	i := slices.Index(args, name)
	if i < 0 || i+1 >= len(args) {
		t.Fatalf("args %q lack %s <value>", args, name)
	}
	return args[i+1]
}

// overrideArgs replaces the values of the named flags (appending the ones
// args lack), so the test runs the manifests' commands on loopback and free
// ports.
func overrideArgs(args []string, set map[string]string, order []string) []string {
	out := slices.Clone(args)
	for _, name := range order {
		if i := slices.Index(out, name); i >= 0 && i+1 < len(out) {
			out[i+1] = set[name]
		} else {
			out = append(out, name, set[name])
		}
	}
	return out
}

func containerPort(c corev1.Container, name string) (int32, bool) {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

// checkProbe asserts an HTTP GET probe on path whose port names a container
// port equal to want.
func checkProbe(t *testing.T, what string, c corev1.Container, p *corev1.Probe, path string, want int) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("%s: no httpGet probe", what)
		return
	}
	port := p.HTTPGet.Port
	n := int(port.IntVal)
	if port.Type == intstr.String {
		cp, ok := containerPort(c, port.StrVal)
		if !ok {
			t.Errorf("%s: probe port %q is not a container port", what, port.StrVal)
		}
		n = int(cp)
	}
	if p.HTTPGet.Path != path || n != want {
		t.Errorf("%s: probe GET %s on port %d, want %s on %d", what, p.HTTPGet.Path, n, path, want)
	}
}

// checkFlagsKnown asserts every --flag in args appears in the binary's
// `<sub> --help`, so a manifest cannot pass a flag the binary rejects.
func checkFlagsKnown(t *testing.T, sub string, args []string) {
	t.Helper()
	help, _, err := runBin(t, sub, "--help")
	if err != nil {
		t.Fatalf("%s --help: %v", sub, err)
	}
	for _, a := range args {
		if !strings.HasPrefix(a, "--") {
			continue
		}
		if !strings.Contains(help, a+"\n") && !strings.Contains(help, a+" ") {
			t.Errorf("manifest passes %s to `lmcache %s`, which --help does not list", a, sub)
		}
	}
}

// TestKubernetesManifests validates the manifests against the API types and
// checks what vLLM and the kubelet depend on: the server's IPC and /dev/shm
// sharing, probes on the right ports and paths, selectors that match, the
// Service the servers' --coordinator-url names, and flags the binary knows.
func TestKubernetesManifests(t *testing.T) {
	m := deployManifests(t)
	if len(m.namespaces) != 1 || len(m.daemonSets) != 1 || len(m.deployments) != 1 || len(m.services) != 1 {
		t.Fatalf("want 1 namespace, daemonset, deployment, service; got %d %d %d %d",
			len(m.namespaces), len(m.daemonSets), len(m.deployments), len(m.services))
	}
	ns := m.namespaces[0].Name

	ds := m.daemonSets[0]
	ps := ds.Spec.Template.Spec
	if ds.Namespace != ns || !ps.HostIPC {
		t.Errorf("server DaemonSet: namespace %q hostIPC %v, want %q and true", ds.Namespace, ps.HostIPC, ns)
	}
	checkSelector(t, "server", ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels)
	if len(ps.Containers) != 1 {
		t.Fatalf("server: %d containers", len(ps.Containers))
	}
	sc := ps.Containers[0]
	if len(sc.Args) == 0 || sc.Args[0] != "server" || sc.Image == "" {
		t.Fatalf("server container: image %q args %q", sc.Image, sc.Args)
	}
	shm := ""
	for _, vm := range sc.VolumeMounts {
		if vm.MountPath == "/dev/shm" {
			shm = vm.Name
		}
	}
	sharesShm := false
	for _, v := range ps.Volumes {
		if v.Name == shm && (v.HostPath != nil && v.HostPath.Path == "/dev/shm" || v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory) {
			sharesShm = true
		}
	}
	if !sharesShm {
		t.Errorf("server: /dev/shm is not mounted from the host's /dev/shm (or a Memory emptyDir): mount %q volumes %+v", shm, ps.Volumes)
	}
	if flagValue(t, sc.Args, "--shm-name") == "" {
		t.Error("server: empty --shm-name: the pool would be private memory vLLM cannot map")
	}
	httpPort, _ := strconv.Atoi(flagValue(t, sc.Args, "--http-port"))
	zmqPort, _ := strconv.Atoi(flagValue(t, sc.Args, "--port"))
	if p, ok := containerPort(sc, "zmq"); !ok || int(p) != zmqPort {
		t.Errorf("server: zmq container port %d, --port %d", p, zmqPort)
	}
	for _, p := range sc.Ports {
		if p.HostPort != p.ContainerPort {
			t.Errorf("server: port %s hostPort %d != containerPort %d (vLLM pods reach the node's IP)", p.Name, p.HostPort, p.ContainerPort)
		}
	}
	checkProbe(t, "server readiness", sc, sc.ReadinessProbe, "/healthcheck", httpPort)
	checkProbe(t, "server liveness", sc, sc.LivenessProbe, "/healthcheck", httpPort)
	if ds.Spec.Template.Annotations["prometheus.io/port"] != strconv.Itoa(httpPort) {
		t.Errorf("server: scrape port annotation %q, want the HTTP port %d", ds.Spec.Template.Annotations["prometheus.io/port"], httpPort)
	}
	checkFlagsKnown(t, "server", sc.Args)

	dep := m.deployments[0]
	if dep.Namespace != ns || dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 || dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("coordinator Deployment: namespace %q replicas %v strategy %q, want one replica recreated", dep.Namespace, dep.Spec.Replicas, dep.Spec.Strategy.Type)
	}
	checkSelector(t, "coordinator", dep.Spec.Selector.MatchLabels, dep.Spec.Template.Labels)
	cc := dep.Spec.Template.Spec.Containers[0]
	if len(cc.Args) == 0 || cc.Args[0] != "coordinator" {
		t.Fatalf("coordinator args %q", cc.Args)
	}
	coordPort, _ := strconv.Atoi(flagValue(t, cc.Args, "--port"))
	checkProbe(t, "coordinator readiness", cc, cc.ReadinessProbe, "/healthz", coordPort)
	checkProbe(t, "coordinator liveness", cc, cc.LivenessProbe, "/healthz", coordPort)
	checkFlagsKnown(t, "coordinator", cc.Args)

	svc := m.services[0]
	checkSelector(t, "coordinator Service", svc.Spec.Selector, dep.Spec.Template.Labels)
	if len(svc.Spec.Ports) != 1 {
		t.Fatalf("Service ports %+v", svc.Spec.Ports)
	}
	sp := svc.Spec.Ports[0]
	if tp, ok := containerPort(cc, sp.TargetPort.StrVal); !ok || int(tp) != coordPort {
		t.Errorf("Service targetPort %v is not the coordinator's port %d", sp.TargetPort, coordPort)
	}
	u, err := url.Parse(flagValue(t, sc.Args, "--coordinator-url"))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%s.%s.svc:%d", svc.Name, svc.Namespace, sp.Port); u.Host != want {
		t.Errorf("server --coordinator-url host %q, want the Service %q", u.Host, want)
	}
}

func checkSelector(t *testing.T, what string, sel, labels map[string]string) {
	t.Helper()
	if len(sel) == 0 {
		t.Errorf("%s: empty selector", what)
	}
	for k, v := range sel {
		if labels[k] != v {
			t.Errorf("%s: selector %s=%s does not match the pod labels %v", what, k, v, labels)
		}
	}
}

// TestManifestsRejectUnknownFields proves the strict decoding bites: a
// misspelt field fails.
func TestManifestsRejectUnknownFields(t *testing.T) {
	raw, err := os.ReadFile("kubernetes/coordinator.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(raw), "readinessProbe:", "readynessProbe:", 1)
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(bad)))
	first, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	err = yaml.UnmarshalStrict(first, &d)
	if err == nil || !strings.Contains(err.Error(), "readynessProbe") {
		t.Fatalf("strict decode of a misspelt field = %v, want an error naming it", err)
	}
}
