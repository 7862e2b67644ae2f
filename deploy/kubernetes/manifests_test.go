// Package kubernetes holds the Kubernetes manifests of Parley (a kustomize base, components and
// overlays, and the Gateway API Inference Extension's objects) and the tests that hold them to the
// server without a cluster: every manifest decodes strictly into its API type, every overlay
// renders with kustomize, and the rendered objects agree with each other and with the server's
// flags, defaults and metrics, read from a built binary.
package kubernetes

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	kustypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// dir returns this package's directory, deploy/kubernetes.
func dir(t testing.TB) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller information")
	}
	return filepath.Dir(file)
}

// repoRoot returns the directory holding go.mod.
func repoRoot(t testing.TB) string {
	return filepath.Join(dir(t), "..", "..")
}

// newObject returns an empty object of the Go type of apiVersion and kind; those the tests know
// are exactly those the manifests may hold.
func newObject(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, nil
	case "v1 Service":
		return &corev1.Service{}, nil
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "v1 PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}, nil
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "autoscaling/v2 HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}, nil
	case "rbac.authorization.k8s.io/v1 Role":
		return &rbacv1.Role{}, nil
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		return &rbacv1.RoleBinding{}, nil
	case "gateway.networking.k8s.io/v1 Gateway":
		return &gatewayv1.Gateway{}, nil
	case "gateway.networking.k8s.io/v1 HTTPRoute":
		return &gatewayv1.HTTPRoute{}, nil
	case "inference.networking.k8s.io/v1 InferencePool":
		return &inferencePool{}, nil
	}
	return nil, fmt.Errorf("%s %s: not a kind these manifests use", apiVersion, kind)
}

// decodeStrict decodes one YAML document into out, failing on fields out's type lacks and on
// fields given twice.
func decodeStrict(doc []byte, out any) error {
	return yaml.UnmarshalStrict(doc, out)
}

// documents splits a YAML stream into its non-empty documents.
func documents(b []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var docs [][]byte
	for {
		d, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(stripComments(d))) > 0 {
			docs = append(docs, d)
		}
	}
}

func stripComments(b []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			out = append(out, l...)
			out = append(out, '\n')
		}
	}
	return out
}

// decodeObjects decodes every document of a YAML stream into the type its apiVersion and kind
// name.
func decodeObjects(b []byte) ([]any, error) {
	docs, err := documents(b)
	if err != nil {
		return nil, err
	}
	var objs []any
	for i, d := range docs {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(d, &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		obj, err := newObject(tm.APIVersion, tm.Kind)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if err := decodeStrict(d, obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i, tm.Kind, err)
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

// notResources are the YAML files here that are no Kubernetes object: each has a test of its own.
var notResources = map[string]bool{
	"components/autoscaling/prometheus-adapter-values.yaml": true, // TestPrometheusAdapterRule
	"inference-extension/endpoint-picker-config.yaml":       true, // TestInferencePool
}

// TestManifestsDecode decodes every YAML file under deploy/kubernetes strictly: kustomizations
// into kustomize's Kustomization, objects (and the partial objects patches are) into their
// Kubernetes API types. A misspelt or misplaced field fails.
func TestManifestsDecode(t *testing.T) {
	root := dir(t)
	n := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		n++
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		switch {
		case notResources[rel]:
		case filepath.Base(rel) == "kustomization.yaml":
			var k kustypes.Kustomization
			if err := decodeStrict(b, &k); err != nil {
				t.Errorf("%s: %v", rel, err)
			} else if k.Kind != kustypes.KustomizationKind && k.Kind != kustypes.ComponentKind {
				t.Errorf("%s: kind %q", rel, k.Kind)
			}
		default:
			objs, err := decodeObjects(b)
			if err != nil {
				t.Errorf("%s: %v", rel, err)
			} else if len(objs) == 0 {
				t.Errorf("%s: no object", rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 15 {
		t.Errorf("%d YAML files under %s: the walk missed some", n, root)
	}
}

// kustomize renders the kustomization at dir (relative to deploy/kubernetes) with krusty, the
// library kubectl apply -k runs, and decodes what it renders strictly.
func kustomize(t testing.TB, rel string) []any {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(dir(t), rel))
	if err != nil {
		t.Fatalf("kustomize %s: %v", rel, err)
	}
	b, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeObjects(b)
	if err != nil {
		t.Fatalf("kustomize %s renders: %v", rel, err)
	}
	return objs
}

// kustomizeWith renders a kustomization of the given resources and components (directories
// under deploy/kubernetes), written beside them in an in-memory copy of the directory (kustomize
// takes no absolute paths).
func kustomizeWith(t testing.TB, resources, components []string) []any {
	t.Helper()
	fs := filesys.MakeFsInMemory()
	root := dir(t)
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		return fs.WriteFile(filepath.Join("/k", rel), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	up := func(rels []string) []string {
		var out []string
		for _, r := range rels {
			out = append(out, "../"+r)
		}
		return out
	}
	k := kustypes.Kustomization{TypeMeta: kustypes.TypeMeta{APIVersion: kustypes.KustomizationVersion, Kind: kustypes.KustomizationKind},
		Resources: up(resources), Components: up(components)}
	b, err := yaml.Marshal(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.WriteFile("/k/composed/kustomization.yaml", b); err != nil {
		t.Fatal(err)
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, "/k/composed")
	if err != nil {
		t.Fatalf("kustomize %v + %v: %v", resources, components, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeObjects(out)
	if err != nil {
		t.Fatalf("kustomize %v + %v renders: %v", resources, components, err)
	}
	return objs
}

// all returns the objects of type T among objs.
func all[T any](objs []any) []*T {
	var out []*T
	for _, o := range objs {
		if v, ok := o.(*T); ok {
			out = append(out, v)
		}
	}
	return out
}

// one returns the single object of type T among objs.
func one[T any](t testing.TB, objs []any) *T {
	t.Helper()
	v := all[T](objs)
	if len(v) != 1 {
		var z T
		t.Fatalf("%d objects of type %T, want 1", len(v), z)
	}
	return v[0]
}
