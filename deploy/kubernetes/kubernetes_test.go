package kubernetes

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// renderings are the ways the manifests are applied, each rendered as kubectl apply -k would.
var renderings = []struct {
	name       string
	resources  []string
	components []string
	image      string // the server's image after the overlay's images transformer
}{
	{"overlays/cpu", []string{"overlays/cpu"}, nil, "registry.example.com/parley:cpu"},
	{"overlays/gpu", []string{"overlays/gpu"}, nil, "registry.example.com/parley:cuda"},
	{"overlays/cpu+model-cache-pvc", []string{"overlays/cpu"}, []string{"components/model-cache-pvc"}, "registry.example.com/parley:cpu"},
}

func render(t *testing.T, resources, components []string) []any {
	t.Helper()
	if len(resources) == 1 && len(components) == 0 {
		return kustomize(t, resources[0])
	}
	return kustomizeWith(t, resources, components)
}

// TestOverlays renders each overlay and checks it against the server (its flags, defaults, health
// and metrics endpoints and metric names, read from a built binary and a running server) and the
// images, then runs `parley serve` with exactly the settings the overlay gives it.
func TestOverlays(t *testing.T) {
	f := liveFacts(t)
	for _, r := range renderings {
		t.Run(r.name, func(t *testing.T) {
			objs := render(t, r.resources, r.components)
			for _, err := range checkModelServer(objs, f) {
				t.Error(err)
			}
			c := &checker{}
			ms := findModelServer(c, objs)
			if ms == nil {
				t.Fatal(c.errs)
			}
			if ms.c.Image != r.image {
				t.Errorf("image %s, want %s", ms.c.Image, r.image)
			}
			spec := ms.d.Spec.Template.Spec
			gpu := strings.Contains(r.name, "gpu")
			if q := ms.c.Resources.Limits.Name("nvidia.com/gpu", "DecimalSI"); (q.Value() == 1) != gpu {
				t.Errorf("nvidia.com/gpu limit %v", q)
			}
			tolerates := false
			for _, tol := range spec.Tolerations {
				tolerates = tolerates || tol.Key == "nvidia.com/gpu" && tol.Effect == corev1.TaintEffectNoSchedule
			}
			if tolerates != gpu || (spec.NodeSelector["nvidia.com/gpu.present"] == "true") != gpu {
				t.Errorf("tolerations %v, node selector %v", spec.Tolerations, spec.NodeSelector)
			}
			var cacheVol corev1.Volume
			for _, v := range spec.Volumes {
				if v.Name == "model-cache" {
					cacheVol = v
				}
			}
			if strings.Contains(r.name, "pvc") {
				var pvcs []string
				for _, p := range all[corev1.PersistentVolumeClaim](objs) {
					pvcs = append(pvcs, p.Name)
				}
				if cacheVol.PersistentVolumeClaim == nil || len(pvcs) != 1 || cacheVol.PersistentVolumeClaim.ClaimName != pvcs[0] {
					t.Errorf("model cache %+v, claims %v", cacheVol, pvcs)
				}
			} else if cacheVol.EmptyDir == nil || cacheVol.EmptyDir.SizeLimit == nil {
				t.Errorf("model cache %+v, want an emptyDir with a size limit", cacheVol)
			}

			// The server itself takes the overlay's settings: every PARLEY_* the pod sets, the
			// model a local file that is not there (no download), the CUDA backend left out of a
			// binary without it.
			env := map[string]string{}
			for k, v := range ms.env {
				if strings.HasPrefix(k, "PARLEY_") {
					env[k] = v
				}
			}
			env["PARLEY_MODEL"] = "m=" + filepath.Join(t.TempDir(), "no-such-model.gguf")
			env["PARLEY_PORT"], env["PARLEY_HOST"] = "0", "127.0.0.1"
			env["PARLEY_CACHE"] = t.TempDir()
			env["PARLEY_THREADS"] = "1"
			if env["PARLEY_BACKEND"] == "cuda" && !f.cuda {
				delete(env, "PARLEY_BACKEND")
			}
			if err := serveAccepts(t, env); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestInferencePool renders the inference extension's objects and checks them against the
// overlays' model servers and the running server's metrics.
func TestInferencePool(t *testing.T) {
	f := liveFacts(t)
	objs := kustomize(t, "inference-extension")
	var servers [][]any
	for _, r := range renderings[:2] {
		servers = append(servers, render(t, r.resources, r.components))
	}
	for _, err := range checkInferencePool(objs, servers, f) {
		t.Error(err)
	}
}

// TestPrometheusAdapterRule checks the adapter's rule: it serves a metric the server exports,
// per pod, under the name the autoscaler asks for.
func TestPrometheusAdapterRule(t *testing.T) {
	f := liveFacts(t)
	b, err := os.ReadFile(filepath.Join(dir(t), "components", "autoscaling", "prometheus-adapter-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v adapterValues
	if err := decodeStrict(b, &v); err != nil {
		t.Fatal(err)
	}
	hpa := one[autoscalingv2.HorizontalPodAutoscaler](t, kustomize(t, "overlays/cpu"))
	want := map[string]bool{}
	for _, m := range hpa.Spec.Metrics {
		want[m.Pods.Metric.Name] = true
	}
	for _, r := range v.Rules.Custom {
		series := strings.TrimSpace(strings.SplitN(r.SeriesQuery, "{", 2)[0])
		if !f.metrics[series] {
			t.Errorf("the rule's series %q is not among the server's metrics", series)
		}
		re, err := regexp.Compile(r.Name.Matches)
		if err != nil || !re.MatchString(series) {
			t.Errorf("name.matches %q does not match %s: %v", r.Name.Matches, series, err)
			continue
		}
		served := series
		if r.Name.As != "" {
			served = re.ReplaceAllString(series, r.Name.As)
		}
		if !want[served] {
			t.Errorf("the rule serves %s; the autoscaler asks for %v", served, want)
		}
		delete(want, served)
		ov := r.Resources.Overrides
		if ov["namespace"].Resource != "namespace" || ov["pod"].Resource != "pod" {
			t.Errorf("resources.overrides %v: want the labels namespace and pod mapped to their resources", ov)
		}
		for _, part := range []string{"<<.Series>>", "<<.LabelMatchers>>", "by (<<.GroupBy>>)"} {
			if !strings.Contains(r.MetricsQuery, part) {
				t.Errorf("metricsQuery %q lacks %s", r.MetricsQuery, part)
			}
		}
	}
	if len(want) > 0 {
		t.Errorf("no rule serves %v", want)
	}
}

// TestChecksCatchMismatches breaks one value at a time in a rendered overlay and in the server's
// facts, and requires the checks to report each: a check that cannot fail checks nothing.
func TestChecksCatchMismatches(t *testing.T) {
	f := liveFacts(t)
	deploy := func(objs []any) *appsv1.Deployment {
		for _, d := range all[appsv1.Deployment](objs) {
			if d.Name == "parley" {
				return d
			}
		}
		t.Fatal("no Deployment parley")
		return nil
	}
	server := func(objs []any) *corev1.Container { return &deploy(objs).Spec.Template.Spec.Containers[0] }
	settings := func(objs []any) map[string]string {
		for _, cm := range all[corev1.ConfigMap](objs) {
			if strings.HasPrefix(cm.Name, "parley") {
				return cm.Data
			}
		}
		t.Fatal("no ConfigMap parley")
		return nil
	}
	cases := []struct {
		name   string
		break_ func(objs []any, f *serverFacts)
		want   string
	}{
		{"container port", func(o []any, _ *serverFacts) { server(o).Ports[0].ContainerPort = 8081 }, "listens on port 8080"},
		{"server port", func(o []any, _ *serverFacts) { settings(o)["PARLEY_PORT"] = "9000" }, "listens on port 9000"},
		{"server port by default", func(o []any, _ *serverFacts) {
			delete(settings(o), "PARLEY_PORT")
			server(o).Ports[0].ContainerPort = 9000
		}, "listens on port 8080"},
		{"loopback", func(o []any, _ *serverFacts) { delete(settings(o), "PARLEY_HOST") }, "not loopback"},
		{"probe path", func(o []any, _ *serverFacts) { server(o).ReadinessProbe.HTTPGet.Path = "/healthz" }, "readiness probe asks"},
		{"probe port", func(o []any, _ *serverFacts) { server(o).LivenessProbe.HTTPGet.Port = intstr.FromInt32(9090) }, "liveness probe asks port"},
		{"health path", func(_ []any, f *serverFacts) { f.healthPath = "/healthz" }, "startup probe asks"},
		{"grace period", func(o []any, _ *serverFacts) { *deploy(o).Spec.Template.Spec.TerminationGracePeriodSeconds = 40 }, "terminationGracePeriodSeconds"},
		{"shutdown grace", func(o []any, _ *serverFacts) { settings(o)["PARLEY_SHUTDOWN_GRACE"] = "2m" }, "terminationGracePeriodSeconds"},
		{"default shutdown grace", func(o []any, f *serverFacts) {
			delete(settings(o), "PARLEY_SHUTDOWN_GRACE")
			fl := f.flags["shutdown-grace"]
			fl.def = "1m0s"
			f.flags = cloneFlags(f.flags, "shutdown-grace", fl)
		}, "terminationGracePeriodSeconds"},
		{"no preStop", func(o []any, _ *serverFacts) { server(o).Lifecycle = nil }, "preStop"},
		{"metrics path", func(o []any, _ *serverFacts) { deploy(o).Spec.Template.Annotations["prometheus.io/path"] = "/stats" }, "scrape annotations"},
		{"autoscaler metric", func(o []any, _ *serverFacts) {
			one[autoscalingv2.HorizontalPodAutoscaler](t, o).Spec.Metrics[0].Pods.Metric.Name = "parley_queue_length"
		}, "does not export"},
		{"unknown setting", func(o []any, _ *serverFacts) { settings(o)["PARLEY_MAX_QUEUE"] = "4" }, "no flag --max-queue"},
		{"bad int", func(o []any, _ *serverFacts) { settings(o)["PARLEY_PARALLEL"] = "eight" }, "PARLEY_PARALLEL"},
		{"bad duration", func(o []any, _ *serverFacts) { settings(o)["PARLEY_SHUTDOWN_GRACE"] = "30" }, "shutdown-grace"},
		{"writable root", func(o []any, _ *serverFacts) { f := false; server(o).SecurityContext.ReadOnlyRootFilesystem = &f }, "read-only root"},
		{"image user", func(_ []any, f *serverFacts) { f.imageUID = 65532 }, "runAsUser"},
		{"threads", func(o []any, _ *serverFacts) {
			server(o).Env[1].ValueFrom.ResourceFieldRef.Resource = "requests.memory"
		}, "PARLEY_THREADS"},
		{"kv budget", func(o []any, _ *serverFacts) { settings(o)["PARLEY_KV_MEM"] = "4096" }, "memory limit"},
		{"cache", func(o []any, _ *serverFacts) { settings(o)["PARLEY_CACHE"] = "/var/cache/parley" }, "PARLEY_CACHE"},
		{"service", func(o []any, _ *serverFacts) {
			one[corev1.Service](t, o).Spec.Ports[0].TargetPort = intstr.FromString("api")
		}, "Service parley sends"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := kustomize(t, "overlays/cpu")
			bf := f
			tc.break_(objs, &bf)
			errs := checkModelServer(objs, bf)
			for _, err := range errs {
				if strings.Contains(err.Error(), tc.want) {
					return
				}
			}
			t.Errorf("no error mentions %q; got %v", tc.want, errs)
		})
	}

	pool := []struct {
		name   string
		break_ func(objs []any, f *serverFacts)
		want   string
	}{
		{"target port", func(o []any, _ *serverFacts) { one[inferencePool](t, o).Spec.TargetPorts[0].Number = 8000 }, "targets ports"},
		{"selector", func(o []any, _ *serverFacts) {
			one[inferencePool](t, o).Spec.Selector.MatchLabels["app.kubernetes.io/name"] = "vllm"
		}, "not the model server's pods"},
		{"metric names", func(_ []any, f *serverFacts) {
			m := map[string]bool{}
			for k := range f.metrics {
				if k != "vllm:num_requests_waiting" {
					m[k] = true
				}
			}
			f.metrics = m
		}, "lacks"},
		{"route timeout", func(_ []any, f *serverFacts) {
			fl := f.flags["timeout"]
			fl.def = "30m0s"
			f.flags = cloneFlags(f.flags, "timeout", fl)
		}, "cuts requests"},
		{"picker pool", func(o []any, _ *serverFacts) { one[inferencePool](t, o).Name = "other" }, "watches pool"},
		{"picker port", func(o []any, _ *serverFacts) {
			for _, s := range all[corev1.Service](o) {
				s.Spec.Ports[0].TargetPort = intstr.FromString("nope")
			}
		}, "does not carry"},
		{"picker grace", func(o []any, _ *serverFacts) {
			for _, d := range all[appsv1.Deployment](o) {
				*d.Spec.Template.Spec.TerminationGracePeriodSeconds = 20
			}
		}, "shorter than the model servers'"},
	}
	servers := [][]any{kustomize(t, "overlays/cpu")}
	for _, tc := range pool {
		t.Run("pool/"+tc.name, func(t *testing.T) {
			objs := kustomize(t, "inference-extension")
			bf := f
			tc.break_(objs, &bf)
			errs := checkInferencePool(objs, servers, bf)
			for _, err := range errs {
				if strings.Contains(err.Error(), tc.want) {
					return
				}
			}
			t.Errorf("no error mentions %q; got %v", tc.want, errs)
		})
	}
}

func cloneFlags(m map[string]flagInfo, name string, fl flagInfo) map[string]flagInfo {
	out := map[string]flagInfo{}
	for k, v := range m {
		out[k] = v
	}
	out[name] = fl
	return out
}

// TestParseHelp reads both help layouts.
func TestParseHelp(t *testing.T) {
	goStyle := "usage: parley serve [flags]\n\nflags:\n  -host string\n    \taddress to listen on (default \"127.0.0.1\")\n  -prefix-cache\n    \treuse blocks (default true)\n  -t int\n    \tCPU threads (0: one per core; default $PARLEY_THREADS or 0)\n  -timeout duration\n    \tlongest a generation may run ($PARLEY_TIMEOUT) (default 10m0s)\n"
	posix := "Flags:\n      --host string              address to listen on (default \"127.0.0.1\")\n  -t, --threads int              CPU threads\n      --shutdown-grace duration  grace (default 30s)\n"
	for _, c := range []struct {
		text string
		want map[string]flagInfo
	}{
		{goStyle, map[string]flagInfo{"host": {typ: "string", def: "127.0.0.1"}, "prefix-cache": {def: "true"}, "t": {typ: "int"}, "timeout": {typ: "duration", def: "10m0s"}}},
		{posix, map[string]flagInfo{"host": {typ: "string", def: "127.0.0.1"}, "threads": {typ: "int"}, "shutdown-grace": {typ: "duration", def: "30s"}}},
	} {
		got := parseHelp(c.text)
		if len(got) != len(c.want) {
			t.Errorf("%d flags, want %d: %v", len(got), len(c.want), got)
		}
		for name, w := range c.want {
			if g, ok := got[name]; !ok || g.typ != w.typ || g.def != w.def {
				t.Errorf("--%s: %+v, want type %q default %q", name, g, w.typ, w.def)
			}
		}
	}
}
