// Package kubernetes checks the Kubernetes manifests beside it without a cluster: each
// document is decoded strictly (an unknown or misspelt field fails) into the Kubernetes
// API types, and checked against the dispenser's own --help (built from the repository)
// and against the NATS Helm chart values. It is a module of its own so that the main
// module does not depend on k8s.io; make test runs it.
package kubernetes

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

const (
	manifestFile = "dispenser.yaml"
	valuesFile   = "nats-values.yaml"
	rolesConf    = "../nats-roles.conf"
	idKeyEnv     = "LEAFBUS_ID_KEY" // the one LEAFBUS_ variable that is no flag's
)

// manifests holds the documents of manifestFile, by kind.
type manifests struct {
	sets   []appsv1.StatefulSet
	svcs   []corev1.Service
	pdbs   []policyv1.PodDisruptionBudget
	kinds  []string
	source map[string]string // kind/name -> document, for messages
}

// readManifests decodes every document of manifestFile strictly into its API type.
func readManifests(t *testing.T) manifests {
	t.Helper()
	b, err := os.ReadFile(manifestFile)
	if err != nil {
		t.Fatal(err)
	}
	var m manifests
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(doc, "")) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("%s document %d: %v", manifestFile, i, err)
		}
		var target any
		switch gvk := tm.APIVersion + " " + tm.Kind; gvk {
		case "apps/v1 StatefulSet":
			m.sets = append(m.sets, appsv1.StatefulSet{})
			target = &m.sets[len(m.sets)-1]
		case "v1 Service":
			m.svcs = append(m.svcs, corev1.Service{})
			target = &m.svcs[len(m.svcs)-1]
		case "policy/v1 PodDisruptionBudget":
			m.pdbs = append(m.pdbs, policyv1.PodDisruptionBudget{})
			target = &m.pdbs[len(m.pdbs)-1]
		default:
			t.Fatalf("%s document %d: %q: want apps/v1 StatefulSet, v1 Service or policy/v1 PodDisruptionBudget", manifestFile, i, gvk)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), target); err != nil {
			t.Fatalf("%s document %d (%s): %v", manifestFile, i, tm.Kind, err)
		}
		m.kinds = append(m.kinds, tm.Kind)
	}
	return m
}

// dispenserHelp builds the dispenser from the repository once and returns its flags
// (name -> default, as --help prints them) and the usage text of each.
var dispenserHelp = sync.OnceValues(func() (map[string]helpFlag, error) {
	dir, err := os.MkdirTemp("", "leafbus-k8s")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "dispenser")
	build := exec.Command("go", "build", "-o", bin, "./cmd/dispenser")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ./cmd/dispenser: %v\n%s", err, out)
	}
	var stderr bytes.Buffer
	help := exec.Command(bin, "--help")
	help.Stderr = &stderr
	if err := help.Run(); err != nil {
		return nil, fmt.Errorf("dispenser --help: %v\n%s", err, stderr.String())
	}
	return parseHelp(stderr.String()), nil
})

type helpFlag struct{ usage, def string }

// parseHelp reads flag.PrintDefaults' output: "  -name type" then the usage, indented,
// ending with (default "x") or (default x) when the default is not the zero value.
func parseHelp(help string) map[string]helpFlag {
	flags := map[string]helpFlag{}
	name := ""
	for _, line := range strings.Split(help, "\n") {
		if m := regexp.MustCompile(`^  -([a-z0-9-]+)`).FindStringSubmatch(line); m != nil {
			name = m[1]
			flags[name] = helpFlag{}
			continue
		}
		if name == "" || !strings.HasPrefix(line, "    ") {
			continue
		}
		f := flags[name]
		f.usage += strings.TrimSpace(line) + " "
		if d := regexp.MustCompile(`\(default "?([^")]*)"?\)$`).FindStringSubmatch(strings.TrimSpace(line)); d != nil {
			f.def = d[1]
		}
		flags[name] = f
	}
	return flags
}

func help(t *testing.T) map[string]helpFlag {
	t.Helper()
	flags, err := dispenserHelp()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"nats", "http", "data-dir", "node-id"} {
		if _, ok := flags[want]; !ok {
			t.Fatalf("dispenser --help lists no --%s among %d flags: has its format changed?", want, len(flags))
		}
	}
	return flags
}

// envName is a flag's environment variable, as the dispenser reads it.
func envName(flag string) string {
	return "LEAFBUS_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// TestManifests: the StatefulSet, Service and PodDisruptionBudget decode strictly; every
// container argument is a dispenser flag and every LEAFBUS_ variable a flag's (or the ID
// key); the node ID is the pod's name; the data dir is on a volume claim template; the
// probes ask /healthz and /readyz (the paths --help gives --http) on the port --http
// listens on; the secrets come from a Secret; and the Service and the budget select the
// StatefulSet's pods.
func TestManifests(t *testing.T) {
	m := readManifests(t)
	if len(m.sets) != 1 || len(m.svcs) != 1 || len(m.pdbs) != 1 {
		t.Fatalf("%s holds %v: want one StatefulSet, one Service, one PodDisruptionBudget", manifestFile, m.kinds)
	}
	flags := help(t)
	sts, svc, pdb := m.sets[0], m.svcs[0], m.pdbs[0]
	pod := sts.Spec.Template
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("StatefulSet %s: %d containers, want the dispenser alone", sts.Name, len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]

	args := map[string]string{}
	for _, a := range c.Args {
		name, value, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "--") || !ok {
			t.Errorf("container arg %q: want --flag=value", a)
			continue
		}
		if _, known := flags[name]; !known {
			t.Errorf("container arg %q: dispenser --help lists no --%s", a, name)
		}
		args[name] = value
	}
	if len(c.Command) > 0 {
		t.Errorf("container command %q: the image's entrypoint is the dispenser; give flags as args", c.Command)
	}

	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
		known := e.Name == idKeyEnv
		for name := range flags {
			known = known || envName(name) == e.Name
		}
		if strings.HasPrefix(e.Name, "LEAFBUS_") && !known {
			t.Errorf("env %s: no dispenser flag reads it", e.Name)
		}
	}
	// The node ID is the pod's name, through the downward API (or --node-id=$(POD_NAME)
	// with POD_NAME from it).
	nodeID := env[envName("node-id")]
	if v, ok := args["node-id"]; ok {
		ref := strings.TrimSuffix(strings.TrimPrefix(v, "$("), ")")
		nodeID = env[ref]
	}
	if nodeID.ValueFrom == nil || nodeID.ValueFrom.FieldRef == nil || nodeID.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("the node ID (%s or --node-id) is not the pod's name from the downward API (fieldRef metadata.name): %+v", envName("node-id"), nodeID)
	}
	for _, secret := range []string{"password", "service-password", "token", "service-token", "mysql-dsn"} {
		if _, ok := args[secret]; ok {
			t.Errorf("container arg --%s: a secret in the pod spec; take %s from a Secret", secret, envName(secret))
		}
		if e, ok := env[envName(secret)]; ok && (e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
			t.Errorf("env %s: want it from a Secret (secretKeyRef), not a literal", e.Name)
		}
	}
	for _, want := range []string{envName("password"), envName("service-password"), idKeyEnv} {
		if e := env[want]; e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			t.Errorf("env %s: want a secretKeyRef", want)
		}
	}
	if args["user"] == "" || args["service-user"] == "" {
		t.Errorf("--user %q --service-user %q: want the roles' users (deploy/nats-roles.conf: dispenser, dispenser-service)", args["user"], args["service-user"])
	}

	// The data dir is a volume of a claim template.
	dataDir := args["data-dir"]
	if dataDir == "" {
		dataDir = flags["data-dir"].def
	}
	claims := map[string]bool{}
	for _, vc := range sts.Spec.VolumeClaimTemplates {
		claims[vc.Name] = true
	}
	onClaim := false
	for _, vm := range c.VolumeMounts {
		if path.Clean(vm.MountPath) == path.Clean(dataDir) && claims[vm.Name] && !vm.ReadOnly {
			onClaim = true
		}
	}
	if !onClaim {
		t.Errorf("--data-dir %q is not mounted from a volumeClaimTemplate (%v): each pod needs a data dir of its own that outlives it", dataDir, c.VolumeMounts)
	}

	// Probes: paths the dispenser serves on its --http port.
	httpAddr := args["http"]
	if httpAddr == "" {
		httpAddr = flags["http"].def
	}
	host, port, err := net.SplitHostPort(httpAddr)
	if err != nil {
		t.Fatalf("--http %q: %v", httpAddr, err)
	}
	if host != "0.0.0.0" && host != "" && host != "::" {
		t.Errorf("--http %q: the kubelet's probes and the Service reach the pod's IP; listen on 0.0.0.0", httpAddr)
	}
	containerPort := func(p intstr.IntOrString) string {
		if p.Type == intstr.Int {
			return strconv.Itoa(p.IntValue())
		}
		for _, cp := range c.Ports {
			if cp.Name == p.StrVal {
				return strconv.Itoa(int(cp.ContainerPort))
			}
		}
		return "no port named " + p.StrVal
	}
	for _, p := range []struct {
		what  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}, {"startup", c.StartupProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			if p.what != "startup" {
				t.Errorf("%s probe: want an httpGet on %s", p.what, p.path)
			}
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path || !strings.Contains(flags["http"].usage, p.path) {
			t.Errorf("%s probe path %q, want %s (which dispenser --help's --http names: %q)", p.what, g.Path, p.path, flags["http"].usage)
		}
		if got := containerPort(g.Port); got != port {
			t.Errorf("%s probe port %s is %s, want --http's port %s", p.what, g.Port.String(), got, port)
		}
	}

	// The Service and the budget select the StatefulSet's pods; the Service forwards to
	// the HTTP port.
	sel, err := metav1.LabelSelectorAsMap(sts.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range sel {
		if pod.Labels[k] != v {
			t.Errorf("StatefulSet selector %v does not select its own pod labels %v", sel, pod.Labels)
		}
	}
	matches := func(what string, s map[string]string) {
		if len(s) == 0 {
			t.Errorf("%s selects every pod", what)
		}
		for k, v := range s {
			if pod.Labels[k] != v {
				t.Errorf("%s selector %v does not select the dispensers (labels %v)", what, s, pod.Labels)
			}
		}
	}
	matches("Service "+svc.Name, svc.Spec.Selector)
	pdbSel, err := metav1.LabelSelectorAsMap(pdb.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	matches("PodDisruptionBudget "+pdb.Name, pdbSel)
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget maxUnavailable %v, want 1: one dispenser away at a time", pdb.Spec.MaxUnavailable)
	}
	if sts.Spec.ServiceName != svc.Name {
		t.Errorf("StatefulSet serviceName %q, want the Service %q", sts.Spec.ServiceName, svc.Name)
	}
	for _, sp := range svc.Spec.Ports {
		if got := containerPort(sp.TargetPort); got != port {
			t.Errorf("Service port %s targets %s, want --http's port %s", sp.Name, got, port)
		}
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas < 2 {
		t.Errorf("StatefulSet replicas %v: want at least 2, so that one can go", sts.Spec.Replicas)
	}
}

// natsValues is the part of the NATS Helm chart's values (chart 1.x) nats-values.yaml
// uses; decoding is strict, so a key outside it fails here. Schema:
//
//	fullnameOverride: string
//	config.cluster:           {enabled: bool, replicas: int}
//	config.jetstream:         {enabled: bool, memoryStore: {enabled, maxSize}, fileStore: {enabled, dir, pvc: {enabled, size}}}
//	config.monitor:           {enabled: bool}
//	config.merge:             {$include: string}  (merged into nats.conf, at /etc/nats-config)
//	container.env:            map of name -> {valueFrom: EnvVarSource}
//	container.patch:          JSON patches of the container (volumeMounts)
//	podTemplate.patch:        JSON patches of the pod template (volumes)
type natsValues struct {
	FullnameOverride string `json:"fullnameOverride"`
	Config           struct {
		Cluster struct {
			Enabled  bool `json:"enabled"`
			Replicas int  `json:"replicas"`
		} `json:"cluster"`
		JetStream struct {
			Enabled     bool `json:"enabled"`
			MemoryStore struct {
				Enabled bool   `json:"enabled"`
				MaxSize string `json:"maxSize"`
			} `json:"memoryStore"`
			FileStore struct {
				Enabled bool   `json:"enabled"`
				Dir     string `json:"dir"`
				PVC     struct {
					Enabled bool   `json:"enabled"`
					Size    string `json:"size"`
				} `json:"pvc"`
			} `json:"fileStore"`
		} `json:"jetstream"`
		Monitor struct {
			Enabled bool `json:"enabled"`
		} `json:"monitor"`
		Merge struct {
			Include string `json:"$include"`
		} `json:"merge"`
	} `json:"config"`
	Container struct {
		Env map[string]struct {
			ValueFrom corev1.EnvVarSource `json:"valueFrom"`
		} `json:"env"`
		Patch []struct {
			Op    string             `json:"op"`
			Path  string             `json:"path"`
			Value corev1.VolumeMount `json:"value"`
		} `json:"patch"`
	} `json:"container"`
	PodTemplate struct {
		Patch []struct {
			Op    string        `json:"op"`
			Path  string        `json:"path"`
			Value corev1.Volume `json:"value"`
		} `json:"patch"`
	} `json:"podTemplate"`
}

// chartConfigDir is where the chart mounts nats.conf: config.merge's $include is
// relative to it.
const chartConfigDir = "/etc/nats-config"

// TestNATSValues: nats-values.yaml decodes strictly against natsValues; a cluster of 3
// with JetStream on file storage (a claim per server), at least the dispensers'
// --kv-replicas; the roles of nats-roles.conf included from a ConfigMap mounted where
// the include finds them, with every password that file reads from a Secret; and the
// chart's client Service is the host the dispensers' --nats names.
func TestNATSValues(t *testing.T) {
	b, err := os.ReadFile(valuesFile)
	if err != nil {
		t.Fatal(err)
	}
	var v natsValues
	if err := yaml.UnmarshalStrict(b, &v); err != nil {
		t.Fatalf("%s: %v", valuesFile, err)
	}
	js := v.Config.JetStream
	if !v.Config.Cluster.Enabled || v.Config.Cluster.Replicas != 3 {
		t.Errorf("cluster %+v: want enabled with 3 replicas", v.Config.Cluster)
	}
	if !js.Enabled || !js.FileStore.Enabled || !js.FileStore.PVC.Enabled || js.FileStore.PVC.Size == "" {
		t.Errorf("jetstream %+v: want JetStream with file storage on a volume claim", js)
	}

	// The include: a file of a ConfigMap volume, mounted where the include points.
	inc := path.Join(chartConfigDir, v.Config.Merge.Include)
	if v.Config.Merge.Include == "" || path.Base(inc) != path.Base(rolesConf) {
		t.Errorf("config.merge.$include %q: want the roles file %s", v.Config.Merge.Include, path.Base(rolesConf))
	}
	volumes := map[string]corev1.Volume{}
	for _, p := range v.PodTemplate.Patch {
		if p.Op == "add" && p.Path == "/spec/volumes/-" {
			volumes[p.Value.Name] = p.Value
		}
	}
	mounted := false
	for _, p := range v.Container.Patch {
		vol, ok := volumes[p.Value.Name]
		if p.Op == "add" && p.Path == "/volumeMounts/-" && ok && vol.ConfigMap != nil && path.Dir(inc) == path.Clean(p.Value.MountPath) {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("%s is not in a ConfigMap volume mounted at %s (container.patch %+v, podTemplate.patch %+v)", inc, path.Dir(inc), v.Container.Patch, v.PodTemplate.Patch)
	}

	roles, err := os.ReadFile(rolesConf)
	if err != nil {
		t.Fatal(err)
	}
	needed := regexp.MustCompile(`\$(NATS_[A-Z0-9_]+_PASSWORD)`).FindAllStringSubmatch(string(roles), -1)
	if len(needed) == 0 {
		t.Fatalf("%s reads no NATS_*_PASSWORD: has it changed?", rolesConf)
	}
	for _, n := range needed {
		e, ok := v.Container.Env[n[1]]
		if !ok || e.ValueFrom.SecretKeyRef == nil {
			t.Errorf("container.env %s (read by %s): want it from a Secret (valueFrom.secretKeyRef)", n[1], rolesConf)
		}
	}

	// The dispensers join this cluster, and it holds their replicas.
	m := readManifests(t)
	for _, sts := range m.sets {
		for _, a := range sts.Spec.Template.Spec.Containers[0].Args {
			name, value, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			switch name {
			case "nats":
				for _, u := range strings.Split(value, ",") {
					host := strings.TrimPrefix(u, "nats://")
					host, _, _ = strings.Cut(host, ":")
					if host != v.FullnameOverride && !strings.HasPrefix(host, v.FullnameOverride+".") {
						t.Errorf("--nats %s: host %q is not the chart's Service %q", value, host, v.FullnameOverride)
					}
				}
			case "kv-replicas":
				if n, err := strconv.Atoi(value); err != nil || n > v.Config.Cluster.Replicas {
					t.Errorf("--kv-replicas %s: want at most the cluster's %d servers", value, v.Config.Cluster.Replicas)
				}
			}
		}
	}
	if !slices.Contains(m.kinds, "StatefulSet") {
		t.Error("no StatefulSet to check --nats against")
	}
}
