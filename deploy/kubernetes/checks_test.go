package kubernetes

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const (
	// serverDrain is how long the server may take after its shutdown grace to tell the requests
	// it cut (cmd/parley/serve.go: the final Shutdown's 5 s).
	serverDrain = 5 * time.Second
	// minStartup is the least time the startup probe must allow for loading a model.
	minStartup = 5 * time.Minute
)

// checker collects mismatches.
type checker struct{ errs []error }

func (c *checker) errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf(format, args...))
}

// modelServer is the rendered Deployment of Parley with what it refers to.
type modelServer struct {
	d       *appsv1.Deployment
	c, init *corev1.Container
	env     map[string]string // the container's environment: its ConfigMap, then its env, $(VAR) expanded
	fromRef map[string]*corev1.EnvVarSource
	port    int32 // the container port named http
}

// findModelServer finds the Deployment parley among objs and resolves its container's
// environment the way the kubelet does.
func findModelServer(c *checker, objs []any) *modelServer {
	var ms modelServer
	for _, d := range all[appsv1.Deployment](objs) {
		if d.Name == "parley" {
			ms.d = d
		}
	}
	if ms.d == nil {
		c.errorf("no Deployment parley")
		return nil
	}
	spec := &ms.d.Spec.Template.Spec
	for i := range spec.Containers {
		if spec.Containers[i].Name == "parley" {
			ms.c = &spec.Containers[i]
		}
	}
	for i := range spec.InitContainers {
		if spec.InitContainers[i].Name == "fetch-model" {
			ms.init = &spec.InitContainers[i]
		}
	}
	if ms.c == nil || ms.init == nil {
		c.errorf("Deployment parley lacks the container parley or the init container fetch-model")
		return nil
	}
	ms.env, ms.fromRef = resolveEnv(c, objs, ms.c)
	for _, p := range ms.c.Ports {
		if p.Name == "http" {
			ms.port = p.ContainerPort
		}
	}
	if ms.port == 0 {
		c.errorf("container parley has no port named http")
	}
	return &ms
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// resolveEnv returns a container's environment: the ConfigMaps of envFrom, then env in order,
// each value's $(VAR) replaced by the variables defined before it; and the variables set from
// elsewhere (fields, resources, secrets).
func resolveEnv(c *checker, objs []any, ctr *corev1.Container) (map[string]string, map[string]*corev1.EnvVarSource) {
	env := map[string]string{}
	from := map[string]*corev1.EnvVarSource{}
	for _, ef := range ctr.EnvFrom {
		if ef.ConfigMapRef == nil {
			continue
		}
		var cm *corev1.ConfigMap
		for _, o := range all[corev1.ConfigMap](objs) {
			if o.Name == ef.ConfigMapRef.Name {
				cm = o
			}
		}
		if cm == nil {
			c.errorf("container %s: envFrom names the ConfigMap %q, which is not rendered", ctr.Name, ef.ConfigMapRef.Name)
			continue
		}
		maps.Copy(env, cm.Data)
	}
	for _, e := range ctr.Env {
		if e.ValueFrom != nil {
			from[e.Name] = e.ValueFrom
			continue
		}
		env[e.Name] = varRef.ReplaceAllStringFunc(e.Value, func(m string) string {
			if v, ok := env[m[2:len(m)-1]]; ok {
				return v
			}
			c.errorf("container %s: %s refers to %s, defined by nothing before it", ctr.Name, e.Name, m)
			return m
		})
	}
	return env, from
}

// setting returns the value the server takes for flag: the environment's $PARLEY_<FLAG>, else
// the flag's default.
func (ms *modelServer) setting(f serverFacts, flag string) string {
	if v, ok := ms.env["PARLEY_"+strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))]; ok {
		return v
	}
	return f.flags[flag].def
}

func (ms *modelServer) duration(c *checker, f serverFacts, flag string) time.Duration {
	s := ms.setting(f, flag)
	d, err := time.ParseDuration(s)
	if err != nil {
		c.errorf("--%s %q: %v", flag, s, err)
	}
	return d
}

// resolvePort returns the container port a probe or Service names (by name or number), 0 if none.
func resolvePort(ctr *corev1.Container, p intstr.IntOrString) int32 {
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range ctr.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	return 0
}

func window(p *corev1.Probe) time.Duration {
	period, failures := p.PeriodSeconds, p.FailureThreshold
	if period == 0 {
		period = 10
	}
	if failures == 0 {
		failures = 3
	}
	return time.Duration(period*failures) * time.Second
}

// selects reports whether every label of sel is among labels.
func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// checkModelServer checks a rendered overlay: the Deployment against the server's flags, defaults,
// endpoints and metrics and against the images; the Service, PodDisruptionBudget and autoscaler
// against the Deployment.
func checkModelServer(objs []any, f serverFacts) []error {
	c := &checker{}
	ms := findModelServer(c, objs)
	if ms == nil {
		return c.errs
	}
	d, ctr := ms.d, ms.c
	pod := &d.Spec.Template

	// Every setting is a flag of parley serve (or a variable its help names) and parses as the
	// flag's type.
	names := slices.Sorted(maps.Keys(ms.env))
	for n := range ms.fromRef {
		names = append(names, n)
	}
	for _, name := range names {
		if !strings.HasPrefix(name, "PARLEY_") {
			continue
		}
		flag, ok := f.flags[envFlag(name)]
		if !ok {
			if !strings.Contains(f.help, "$"+name) {
				c.errorf("%s: parley serve has no flag --%s and its help names no $%s", name, envFlag(name), name)
			}
			continue
		}
		v, literal := ms.env[name]
		if !literal {
			continue
		}
		var err error
		switch flag.typ {
		case "int":
			_, err = strconv.Atoi(v)
		case "duration":
			_, err = time.ParseDuration(v)
		case "":
			_, err = strconv.ParseBool(v)
		}
		if err != nil {
			c.errorf("%s=%q does not parse as the %s of --%s: %v", name, v, cmpOr(flag.typ, "bool"), envFlag(name), err)
		}
	}
	if v := ms.env["PARLEY_BACKEND"]; v != "" && !slices.Contains([]string{"auto", "go", "cpu", "cuda"}, v) {
		c.errorf("PARLEY_BACKEND=%q: no such backend", v)
	}

	// The server listens where the probes, the Service and the pool reach it.
	if port := ms.setting(f, "port"); port != strconv.Itoa(int(ms.port)) {
		c.errorf("the server listens on port %s (PARLEY_PORT or the default), the container port http is %d", port, ms.port)
	}
	if host := ms.setting(f, "host"); host != "0.0.0.0" && host != "::" && host != "" {
		c.errorf("the server listens on %q: the kubelet's probes and other pods reach the pod's address, not loopback", host)
	}
	probes := map[string]*corev1.Probe{"startup": ctr.StartupProbe, "readiness": ctr.ReadinessProbe, "liveness": ctr.LivenessProbe}
	for _, kind := range []string{"startup", "readiness", "liveness"} {
		p := probes[kind]
		switch {
		case p == nil || p.HTTPGet == nil:
			c.errorf("container parley has no %s probe over HTTP", kind)
		case p.HTTPGet.Path != f.healthPath:
			c.errorf("%s probe asks %q; the server answers its health at %s", kind, p.HTTPGet.Path, f.healthPath)
		case resolvePort(ctr, p.HTTPGet.Port) != ms.port:
			c.errorf("%s probe asks port %s, the server listens on %d", kind, p.HTTPGet.Port.String(), ms.port)
		}
	}
	a := pod.Annotations
	if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != strconv.Itoa(int(ms.port)) || a["prometheus.io/path"] != f.metricsPath {
		c.errorf("scrape annotations %q %q %q; the server's metrics are at port %d, %s", a["prometheus.io/scrape"], a["prometheus.io/port"], a["prometheus.io/path"], ms.port, f.metricsPath)
	}

	// Shutdown: SIGTERM comes after the preStop sleep; the server then drains for its grace and
	// up to serverDrain more; the kubelet must not kill it before, nor its liveness probe.
	grace := ms.duration(c, f, "shutdown-grace")
	var preStop time.Duration
	if ctr.Lifecycle == nil || ctr.Lifecycle.PreStop == nil || ctr.Lifecycle.PreStop.Sleep == nil {
		c.errorf("container parley has no preStop sleep: new connections may arrive after the listener closes")
	} else {
		preStop = time.Duration(ctr.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	shutdown := preStop + grace + serverDrain
	if tg := pod.Spec.TerminationGracePeriodSeconds; tg == nil || time.Duration(*tg)*time.Second <= shutdown {
		c.errorf("terminationGracePeriodSeconds %v is not longer than the preStop sleep %v + the shutdown grace %v + %v", derefOr(tg, -1), preStop, grace, serverDrain)
	}
	if ctr.LivenessProbe != nil && window(ctr.LivenessProbe) < shutdown {
		c.errorf("the liveness probe gives up after %v, within a graceful shutdown (%v)", window(ctr.LivenessProbe), shutdown)
	}
	if ctr.StartupProbe != nil && window(ctr.StartupProbe) < minStartup {
		c.errorf("the startup probe allows %v for loading the model, want at least %v", window(ctr.StartupProbe), minStartup)
	}

	// Resources: threads from the CPU limit, a KV-cache budget inside the memory limit.
	lim := ctr.Resources.Limits
	if lim.Cpu().IsZero() || lim.Memory().IsZero() || ctr.Resources.Requests.Cpu().IsZero() || ctr.Resources.Requests.Memory().IsZero() {
		c.errorf("container parley: requests %v, limits %v; want CPU and memory in both", ctr.Resources.Requests, lim)
	}
	if src := ms.fromRef["PARLEY_THREADS"]; src == nil || src.ResourceFieldRef == nil || src.ResourceFieldRef.Resource != "limits.cpu" || src.ResourceFieldRef.ContainerName != "parley" {
		c.errorf("PARLEY_THREADS is not the container's CPU limit (the server's default counts the node's cores)")
	}
	gpus := lim.Name("nvidia.com/gpu", "DecimalSI")
	if kv, ok := ms.env["PARLEY_KV_MEM"]; !ok {
		c.errorf("PARLEY_KV_MEM unset: the server's budget comes from /proc/meminfo, the node's memory")
	} else if mib, err := strconv.ParseInt(kv, 10, 64); err == nil {
		if mib == 0 && gpus.IsZero() {
			c.errorf("PARLEY_KV_MEM=0 without a GPU: the budget comes from the node's memory, not the pod's limit")
		}
		if mib<<20 >= lim.Memory().Value() {
			c.errorf("PARLEY_KV_MEM=%d MiB does not fit the memory limit %v with the model", mib, lim.Memory())
		}
	}
	if b := ms.env["PARLEY_BACKEND"]; (b == "cuda") != !gpus.IsZero() {
		c.errorf("PARLEY_BACKEND=%q with %v GPUs", b, gpus)
	}

	// Security: non-root as the images' user, no privilege, a read-only root with writable
	// volumes where the server writes.
	psc := pod.Spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != f.imageUID ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault || psc.FSGroup == nil {
		c.errorf("pod securityContext %+v: want runAsNonRoot, runAsUser %d (the images' USER), an fsGroup and the RuntimeDefault seccomp profile", psc, f.imageUID)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
		n := 0
		if v.EmptyDir != nil {
			n++
		}
		if v.PersistentVolumeClaim != nil {
			n++
		}
		if v.ConfigMap != nil || v.Secret != nil || v.HostPath != nil || v.Ephemeral != nil {
			n++
		}
		if n != 1 {
			c.errorf("volume %s has %d sources", v.Name, n)
		}
	}
	cache := ms.env["PARLEY_CACHE"]
	for _, k := range []*corev1.Container{ms.init, ctr} {
		sc := k.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
			c.errorf("container %s: securityContext %+v; want a read-only root filesystem, no privilege escalation, every capability dropped", k.Name, sc)
		}
		if k.Resources.Limits.Memory().IsZero() {
			c.errorf("container %s has no memory limit", k.Name)
		}
		writable := func(path string) string {
			for _, m := range k.VolumeMounts {
				if (path == m.MountPath || strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")) && !m.ReadOnly {
					if _, ok := volumes[m.Name]; ok {
						return m.Name
					}
				}
			}
			return ""
		}
		if writable("/tmp") == "" {
			c.errorf("container %s: /tmp is on the read-only root filesystem", k.Name)
		}
		if cache == "" || writable(cache) != "model-cache" {
			c.errorf("container %s: PARLEY_CACHE %q is not on the volume model-cache", k.Name, cache)
		}
	}

	// The init container fills the cache with the file the server serves, where it looks for it.
	initEnv, _ := resolveEnv(c, objs, ms.init)
	if initEnv["PARLEY_CACHE"] != cache {
		c.errorf("the init container caches into %q, the server looks in %q", initEnv["PARLEY_CACHE"], cache)
	}
	file := ms.env["MODEL_FILE"]
	if !strings.HasSuffix(ms.env["PARLEY_MODEL"], "="+file) || file == "" {
		c.errorf("PARLEY_MODEL %q does not serve MODEL_FILE %q", ms.env["PARLEY_MODEL"], file)
	}
	if len(ms.init.Args) == 0 || ms.init.Args[len(ms.init.Args)-1] != "$(MODEL_FILE)" || initEnv["MODEL_FILE"] != file {
		c.errorf("the init container runs %q with MODEL_FILE %q; the server serves %q", ms.init.Args, initEnv["MODEL_FILE"], file)
	}
	if ms.init.Image != ctr.Image {
		c.errorf("the init container runs %s, the server %s", ms.init.Image, ctr.Image)
	}

	// The objects around the Deployment select its pods and reach its port.
	labels := pod.Labels
	if d.Spec.Selector == nil || !selects(d.Spec.Selector.MatchLabels, labels) {
		c.errorf("the Deployment's selector does not select its own pods")
	}
	for _, s := range all[corev1.Service](objs) {
		if !selects(s.Spec.Selector, labels) {
			c.errorf("Service %s does not select the model server's pods", s.Name)
		}
		for _, p := range s.Spec.Ports {
			if resolvePort(ctr, p.TargetPort) != ms.port {
				c.errorf("Service %s sends port %d to %s, the server listens on %d", s.Name, p.Port, p.TargetPort.String(), ms.port)
			}
		}
	}
	pdbs := all[policyv1.PodDisruptionBudget](objs)
	if len(pdbs) != 1 || pdbs[0].Spec.Selector == nil || !selects(pdbs[0].Spec.Selector.MatchLabels, labels) {
		c.errorf("want one PodDisruptionBudget selecting the model server's pods")
	}
	for _, h := range all[autoscalingv2.HorizontalPodAutoscaler](objs) {
		if h.Spec.ScaleTargetRef.Kind != "Deployment" || h.Spec.ScaleTargetRef.Name != d.Name {
			c.errorf("HorizontalPodAutoscaler %s scales %s %s", h.Name, h.Spec.ScaleTargetRef.Kind, h.Spec.ScaleTargetRef.Name)
		}
		for _, m := range h.Spec.Metrics {
			if m.Type != autoscalingv2.PodsMetricSourceType || m.Pods == nil {
				c.errorf("HorizontalPodAutoscaler %s: metric of type %s, want Pods", h.Name, m.Type)
				continue
			}
			if !f.metrics[m.Pods.Metric.Name] {
				c.errorf("HorizontalPodAutoscaler %s scales on %s, which the server does not export", h.Name, m.Pods.Metric.Name)
			}
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 2 {
			c.errorf("HorizontalPodAutoscaler %s may scale to one pod, which the PodDisruptionBudget then lets a drain take", h.Name)
		}
		if d.Spec.Replicas != nil {
			c.errorf("the Deployment sets replicas, which every apply resets under the autoscaler")
		}
	}
	return c.errs
}

func derefOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
