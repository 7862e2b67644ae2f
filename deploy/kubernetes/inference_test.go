package kubernetes

import (
	"encoding/json"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/parleyhq/parley/runtime/server"
)

// inferencePool is InferencePool of inference.networking.k8s.io/v1 as api/v1/inferencepool_types.go
// and shared_types.go of github.com/kubernetes-sigs/gateway-api-inference-extension declare it at
// v1.5.0 (commit df9f8909fe06fe2dfd4a6fc0bd0c01a0acabf849; unchanged at v1.6.0), field for field
// with their JSON names, without status. The module itself is not imported: it would raise this
// module's requirements (gRPC, Envoy's control plane, controller-runtime) for one struct. The
// CRD's validation rules are checkInferencePoolSpec.
type inferencePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels,omitempty"`
		} `json:"selector"`
		TargetPorts       []poolPort `json:"targetPorts,omitempty"`
		AppProtocol       string     `json:"appProtocol,omitempty"`
		EndpointPickerRef struct {
			Group       *string   `json:"group,omitempty"`
			Kind        string    `json:"kind,omitempty"`
			Name        string    `json:"name,omitempty"`
			Port        *poolPort `json:"port,omitempty"`
			FailureMode string    `json:"failureMode,omitempty"`
		} `json:"endpointPickerRef"`
	} `json:"spec"`
}

type poolPort struct {
	Number int32 `json:"number,omitempty"`
}

// eppConfig is the endpoint picker's EndpointPickerConfig (inference.networking.x-k8s.io/v1alpha1)
// as far as this configuration uses it: plugins by type, with parameters, and scheduling profiles
// that refer to them.
type eppConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Plugins    []struct {
		Type       string          `json:"type"`
		Name       string          `json:"name,omitempty"`
		Parameters json.RawMessage `json:"parameters,omitempty"`
	} `json:"plugins"`
	SchedulingProfiles []struct {
		Name    string `json:"name"`
		Plugins []struct {
			PluginRef string `json:"pluginRef"`
			Weight    *int   `json:"weight,omitempty"`
		} `json:"plugins"`
	} `json:"schedulingProfiles"`
}

// eppMetricsSource is the metrics-data-source plugin's parameters (pkg/epp/framework/plugins/
// datalayer/source/metrics/datasource.go at v1.5.0).
type eppMetricsSource struct {
	Scheme             string `json:"scheme,omitempty"`
	Path               string `json:"path,omitempty"`
	InsecureSkipVerify bool   `json:"insecureSkipVerify,omitempty"`
}

// eppExtractor is the core-metrics-extractor plugin's parameters (.../extractor/metrics/
// factories.go at v1.5.0), engine configurations left raw.
type eppExtractor struct {
	EngineLabelKey string            `json:"engineLabelKey,omitempty"`
	DefaultEngine  string            `json:"defaultEngine,omitempty"`
	EngineConfigs  []json.RawMessage `json:"engineConfigs,omitempty"`
}

// eppVLLMMapping is the core metrics extractor's mapping for the engine vllm, its default for pods
// without the label inference.networking.k8s.io/engine-type (defaultEngineConfigs in
// pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go at v1.5.0). LoRA is left out:
// Parley serves no adapters and exports no vllm:lora_requests_info.
var eppVLLMMapping = map[string]string{
	"TotalQueuedRequests":  "vllm:num_requests_waiting",
	"TotalRunningRequests": "vllm:num_requests_running",
	"KVCacheUtilization":   "vllm:kv_cache_usage_perc",
	"CacheInfo":            "vllm:cache_config_info",
}

// serverNames are the server's names for the same figures.
var serverNames = map[string]string{
	"TotalQueuedRequests":  server.MetricRequestsWaiting,
	"TotalRunningRequests": server.MetricRequestsRunning,
	"KVCacheUtilization":   server.MetricKVCacheUsage,
	"CacheInfo":            server.MetricCacheConfigInfo,
}

// checkInferencePool checks the inference extension's objects against each other, the model
// server Deployments they route to, and the server's flags and metrics.
func checkInferencePool(objs []any, servers [][]any, f serverFacts) []error {
	c := &checker{}
	pools := all[inferencePool](objs)
	if len(pools) != 1 {
		c.errorf("%d InferencePools, want 1", len(pools))
		return c.errs
	}
	pool := pools[0]
	ps := &pool.Spec
	if n := len(ps.Selector.MatchLabels); n < 1 || n > 64 {
		c.errorf("InferencePool %s: %d selector labels, want 1 to 64", pool.Name, n)
	}
	seen := map[int32]bool{}
	if n := len(ps.TargetPorts); n < 1 || n > 8 {
		c.errorf("InferencePool %s: %d target ports, want 1 to 8", pool.Name, n)
	}
	for _, p := range ps.TargetPorts {
		if p.Number < 1 || p.Number > 65535 || seen[p.Number] {
			c.errorf("InferencePool %s: target port %d out of range or repeated", pool.Name, p.Number)
		}
		seen[p.Number] = true
	}
	if a := ps.AppProtocol; a != "" && a != "http" && a != "kubernetes.io/h2c" {
		c.errorf("InferencePool %s: appProtocol %q", pool.Name, a)
	}
	ref := ps.EndpointPickerRef
	if m := ref.FailureMode; m != "" && m != "FailOpen" && m != "FailClose" {
		c.errorf("InferencePool %s: failureMode %q", pool.Name, m)
	}
	if (ref.Kind == "" || ref.Kind == "Service") && ref.Port == nil {
		c.errorf("InferencePool %s: the endpoint picker's Service needs a port", pool.Name)
	}

	// The pool is Parley's pods, on the server's port.
	for _, objs := range servers {
		mc := &checker{}
		ms := findModelServer(mc, objs)
		if ms == nil {
			c.errs = append(c.errs, mc.errs...)
			continue
		}
		if !selects(ps.Selector.MatchLabels, ms.d.Spec.Template.Labels) {
			c.errorf("InferencePool %s selects %v, not the model server's pods %v", pool.Name, ps.Selector.MatchLabels, ms.d.Spec.Template.Labels)
		}
		if !seen[ms.port] {
			c.errorf("InferencePool %s targets ports %v, the server listens on %d", pool.Name, ps.TargetPorts, ms.port)
		}
	}

	// The picker behind the pool's reference.
	var svc *corev1.Service
	for _, s := range all[corev1.Service](objs) {
		if s.Name == ref.Name {
			svc = s
		}
	}
	var epp *appsv1.Deployment
	var eppCtr *corev1.Container
	if svc == nil {
		c.errorf("InferencePool %s: no Service %s for its endpoint picker", pool.Name, ref.Name)
	} else {
		for _, d := range all[appsv1.Deployment](objs) {
			if selects(svc.Spec.Selector, d.Spec.Template.Labels) {
				epp = d
			}
		}
		if epp == nil || len(epp.Spec.Template.Spec.Containers) != 1 {
			c.errorf("Service %s selects no endpoint picker Deployment of one container", svc.Name)
		} else {
			eppCtr = &epp.Spec.Template.Spec.Containers[0]
			found := false
			for _, p := range svc.Spec.Ports {
				if ref.Port != nil && p.Port == ref.Port.Number {
					if p.TargetPort.IntVal == 0 && p.TargetPort.StrVal == "" {
						found = hasPort(eppCtr, p.Port) // the target port defaults to the port
					} else {
						found = hasPort(eppCtr, resolvePort(eppCtr, p.TargetPort))
					}
				}
			}
			if !found {
				c.errorf("InferencePool %s reaches its picker on port %v, which Service %s does not carry to the picker's container", pool.Name, ref.Port, svc.Name)
			}
		}
	}
	if eppCtr != nil {
		args := map[string]string{}
		for _, a := range eppCtr.Args {
			k, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			args[k] = v
		}
		if args["pool-name"] != pool.Name || args["pool-group"] != "inference.networking.k8s.io" {
			c.errorf("the picker watches pool %q of group %q, not InferencePool %s", args["pool-name"], args["pool-group"], pool.Name)
		}
		// Its configuration file, from the ConfigMap mounted where --config-file points.
		var cfgText string
		for _, m := range eppCtr.VolumeMounts {
			if !strings.HasPrefix(args["config-file"], strings.TrimSuffix(m.MountPath, "/")+"/") {
				continue
			}
			key := strings.TrimPrefix(args["config-file"], strings.TrimSuffix(m.MountPath, "/")+"/")
			for _, v := range epp.Spec.Template.Spec.Volumes {
				if v.Name != m.Name || v.ConfigMap == nil {
					continue
				}
				for _, cm := range all[corev1.ConfigMap](objs) {
					if cm.Name == v.ConfigMap.Name {
						cfgText = cm.Data[key]
					}
				}
			}
		}
		if cfgText == "" {
			c.errorf("the picker's --config-file %q is in no mounted ConfigMap", args["config-file"])
		} else {
			checkEPPConfig(c, cfgText, f)
		}
		// The picker outlives the requests it routed.
		for _, objs := range servers {
			for _, d := range all[appsv1.Deployment](objs) {
				if g, e := d.Spec.Template.Spec.TerminationGracePeriodSeconds, epp.Spec.Template.Spec.TerminationGracePeriodSeconds; d.Name == "parley" && (g == nil || e == nil || *e < *g) {
					c.errorf("the picker's terminationGracePeriodSeconds %v is shorter than the model servers' %v", derefOr(e, -1), derefOr(g, -1))
				}
			}
		}
	}

	// The route from the Gateway to the pool, open as long as a generation may run.
	gws := all[gatewayv1.Gateway](objs)
	routes := all[gatewayv1.HTTPRoute](objs)
	if len(gws) != 1 || len(routes) != 1 {
		c.errorf("%d Gateways and %d HTTPRoutes, want one of each", len(gws), len(routes))
		return c.errs
	}
	gw, route := gws[0], routes[0]
	if len(gw.Spec.Listeners) == 0 || gw.Spec.GatewayClassName == "" {
		c.errorf("Gateway %s has no class or no listener", gw.Name)
	}
	attached := false
	for _, p := range route.Spec.ParentRefs {
		if string(p.Name) == gw.Name && (p.Kind == nil || *p.Kind == "Gateway") {
			attached = true
		}
	}
	if !attached {
		c.errorf("HTTPRoute %s is not attached to Gateway %s", route.Name, gw.Name)
	}
	timeout := f.flags["timeout"].def
	genTimeout, err := time.ParseDuration(timeout)
	if err != nil {
		c.errorf("parley serve --timeout default %q: %v", timeout, err)
	}
	routed := false
	for _, r := range route.Spec.Rules {
		for _, b := range r.BackendRefs {
			if b.Group != nil && *b.Group == "inference.networking.k8s.io" && b.Kind != nil && *b.Kind == "InferencePool" && string(b.Name) == pool.Name {
				routed = true
				var rt time.Duration
				if r.Timeouts != nil && r.Timeouts.Request != nil {
					rt, err = time.ParseDuration(string(*r.Timeouts.Request))
					if err != nil {
						c.errorf("HTTPRoute %s: request timeout %q: %v", route.Name, *r.Timeouts.Request, err)
					}
				}
				if rt <= genTimeout {
					c.errorf("HTTPRoute %s cuts requests after %v, a generation may run for %v (parley serve --timeout)", route.Name, rt, genTimeout)
				}
			}
		}
	}
	if !routed {
		c.errorf("HTTPRoute %s sends nothing to InferencePool %s", route.Name, pool.Name)
	}
	return c.errs
}

func hasPort(ctr *corev1.Container, port int32) bool {
	for _, p := range ctr.Ports {
		if p.ContainerPort == port {
			return true
		}
	}
	return false
}

// checkEPPConfig checks the picker's plugins: the profiles refer to declared plugins; the metrics
// come from the server's metrics path; and the names the extractor reads them by are the server's.
func checkEPPConfig(c *checker, text string, f serverFacts) {
	var cfg eppConfig
	if err := decodeStrict([]byte(text), &cfg); err != nil {
		c.errorf("EndpointPickerConfig: %v", err)
		return
	}
	if cfg.APIVersion != "inference.networking.x-k8s.io/v1alpha1" || cfg.Kind != "EndpointPickerConfig" {
		c.errorf("EndpointPickerConfig is %s %s", cfg.APIVersion, cfg.Kind)
	}
	declared := map[string]bool{}
	engine := ""
	source := false
	for _, p := range cfg.Plugins {
		declared[cmpOr(p.Name, p.Type)] = true
		switch p.Type {
		case "metrics-data-source":
			var ms eppMetricsSource
			if len(p.Parameters) > 0 {
				if err := decodeStrict(p.Parameters, &ms); err != nil {
					c.errorf("metrics-data-source parameters: %v", err)
				}
			}
			if cmpOr(ms.Path, "/metrics") != f.metricsPath || cmpOr(ms.Scheme, "http") != "http" {
				c.errorf("the picker scrapes %s://…%s; the server serves plain HTTP at %s", cmpOr(ms.Scheme, "http"), cmpOr(ms.Path, "/metrics"), f.metricsPath)
			}
			source = true
		case "core-metrics-extractor":
			var ex eppExtractor
			if len(p.Parameters) > 0 {
				if err := decodeStrict(p.Parameters, &ex); err != nil {
					c.errorf("core-metrics-extractor parameters: %v", err)
				}
			}
			if len(ex.EngineConfigs) > 0 {
				c.errorf("core-metrics-extractor declares engine configurations: the test knows only the built-in vllm mapping")
			}
			engine = cmpOr(ex.DefaultEngine, "vllm")
		}
	}
	if !source || engine == "" {
		c.errorf("the picker has no metrics-data-source or no core-metrics-extractor")
	}
	if engine != "" && engine != "vllm" {
		c.errorf("the picker reads unlabelled pods as %q; Parley exports vLLM's names", engine)
	}
	for figure, name := range eppVLLMMapping {
		if serverNames[figure] != name {
			c.errorf("the picker reads %s as %s, the server exports it as %s", figure, name, serverNames[figure])
		}
		if !f.metrics[name] {
			c.errorf("the picker reads %s as %s, which the running server's /metrics lacks", figure, name)
		}
	}
	for _, prof := range cfg.SchedulingProfiles {
		for _, p := range prof.Plugins {
			if !declared[p.PluginRef] {
				c.errorf("profile %s refers to the undeclared plugin %s", prof.Name, p.PluginRef)
			}
		}
	}
	if len(cfg.SchedulingProfiles) == 0 {
		c.errorf("EndpointPickerConfig has no scheduling profile")
	}
}

// adapterValues is the part of the Prometheus Adapter's Helm values that holds its rules; a rule
// is the adapter's DiscoveryRule (pkg/config/config.go of kubernetes-sigs/prometheus-adapter).
type adapterValues struct {
	Rules struct {
		Default bool          `json:"default"`
		Custom  []adapterRule `json:"custom"`
	} `json:"rules"`
}

type adapterRule struct {
	SeriesQuery   string `json:"seriesQuery"`
	SeriesFilters []struct {
		Is    string `json:"is,omitempty"`
		IsNot string `json:"isNot,omitempty"`
	} `json:"seriesFilters,omitempty"`
	Resources struct {
		Overrides map[string]struct {
			Group    string `json:"group,omitempty"`
			Resource string `json:"resource"`
		} `json:"overrides,omitempty"`
		Template string `json:"template,omitempty"`
	} `json:"resources"`
	Name struct {
		Matches string `json:"matches,omitempty"`
		As      string `json:"as,omitempty"`
	} `json:"name"`
	MetricsQuery string `json:"metricsQuery"`
}
