package docker

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
)

// ImageUID is the user every image runs as: numeric, so that Kubernetes can check runAsNonRoot
// against the image, and one for all images, so that one model cache volume serves them all.
const ImageUID = 10001

// TestDockerfilesLint parses and lints every Dockerfile of the repository (Dockerfile,
// Dockerfile.*) with BuildKit's front end: no parser warnings, no lint warnings, every stage's
// base image pinned to a tag.
func TestDockerfilesLint(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "Dockerfile*"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		if n := filepath.Base(f); n == "Dockerfile" || strings.HasPrefix(n, "Dockerfile.") {
			names = append(names, n)
		}
	}
	for _, want := range []string{"Dockerfile", "Dockerfile.cuda"} {
		if !slices.Contains(names, want) {
			t.Errorf("no %s at the repository root", want)
		}
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			p := parse(t, name)
			for _, w := range p.warnings {
				t.Errorf("%s", w)
			}
			for _, s := range p.stages {
				base := p.expand(s.BaseName)
				if strings.Contains(base, "$") {
					t.Errorf("stage %q: base image %q refers to an undefined argument", s.Name, s.BaseName)
				}
				if p.stage(base) == nil && (!strings.Contains(base, ":") || strings.HasSuffix(base, ":latest")) {
					t.Errorf("stage %q: base image %q is not pinned to a tag", s.Name, base)
				}
			}
		})
	}
}

// image is what one image built from a Dockerfile target must be.
type image struct {
	file, target string // target "": the last stage, what `docker build` builds by default
	base         string // prefix of the final stage's base image
	baseHas      string // and a part of it
	buildBase    string // prefix of the base image of the stage the binary is copied from
	buildEnv     map[string]string
	buildRuns    []string // what that stage's RUN instructions must contain
	runs         []string // what the final stage's RUN instructions must contain; nil: no RUN at all (no shell)
	health       bool     // a HEALTHCHECK probing /health; false: HEALTHCHECK NONE
}

var images = []image{
	{
		file: "Dockerfile", base: "debian:", baseHas: "-slim",
		buildBase: "golang:", buildEnv: map[string]string{"CGO_ENABLED": "1"},
		buildRuns: []string{"libopenblas-dev", "go build -trimpath", "./cmd/parley"},
		runs:      []string{"libopenblas0", "ca-certificates"},
		health:    true,
	},
	{
		file: "Dockerfile", target: "static", base: "gcr.io/distroless/static-",
		buildBase: "golang:", buildEnv: map[string]string{"CGO_ENABLED": "0"},
		buildRuns: []string{"go build -tags nocgo -trimpath", "./cmd/parley"},
	},
	{
		file: "Dockerfile.cuda", base: "nvidia/cuda:", baseHas: "-runtime-",
		buildBase: "nvidia/cuda:", buildEnv: map[string]string{"CGO_ENABLED": "1"},
		buildRuns: []string{"scripts/cuda-build", "go build -tags cuda", "./cmd/parley"},
		runs:      []string{"libopenblas0", "ca-certificates"},
		health:    true,
	},
}

// TestImages checks each image the Dockerfiles build: its base images, the build of the binary,
// a numeric non-root user, the server listening on all interfaces on the port exposed, models and
// the hf:// cache under the /models volume, the binary as ENTRYPOINT with serve as CMD, and the
// health check (or its deliberate absence).
func TestImages(t *testing.T) {
	for _, im := range images {
		name := im.file
		if im.target != "" {
			name += "@" + im.target
		}
		t.Run(name, func(t *testing.T) {
			p := parse(t, im.file)
			final := &p.stages[len(p.stages)-1]
			if im.target != "" {
				if final = p.stage(im.target); final == nil {
					t.Fatalf("no stage %q", im.target)
				}
			}
			if base := p.expand(final.BaseName); !strings.HasPrefix(base, im.base) || !strings.Contains(base, im.baseHas) {
				t.Errorf("final stage is based on %q, want %s…%s", base, im.base, im.baseHas)
			}
			var (
				user, from       string
				health           *instructions.HealthCheckCommand
				exposed, volumes []string
				entrypoint, cmd  []string
				onPID            bool
				runs             []string
			)
			env := map[string]string{}
			for _, c := range final.Commands {
				switch c := c.(type) {
				case *instructions.UserCommand:
					user = c.User
				case *instructions.HealthCheckCommand:
					health = c
				case *instructions.ExposeCommand:
					exposed = append(exposed, c.Ports...)
				case *instructions.VolumeCommand:
					volumes = append(volumes, c.Volumes...)
				case *instructions.EntrypointCommand:
					entrypoint, onPID = c.CmdLine, !c.PrependShell
				case *instructions.CmdCommand:
					cmd = c.CmdLine
				case *instructions.EnvCommand:
					for _, kv := range c.Env {
						env[kv.Key] = kv.Value
					}
				case *instructions.RunCommand:
					runs = append(runs, strings.Join(c.CmdLine, " "))
				case *instructions.CopyCommand:
					if c.From != "" && slices.Contains(c.SourcePaths, "/out/parley") {
						from = c.From
					}
				}
			}

			build := p.stage(from)
			if build == nil {
				t.Fatalf("final stage copies /out/parley from %q, not from a stage of this file", from)
			}
			if base := p.expand(build.BaseName); !strings.HasPrefix(base, im.buildBase) {
				t.Errorf("build stage %q is based on %q, want %s…", build.Name, base, im.buildBase)
			}
			buildEnv := map[string]string{}
			buildRuns := ""
			for _, c := range build.Commands {
				switch c := c.(type) {
				case *instructions.EnvCommand:
					for _, kv := range c.Env {
						buildEnv[kv.Key] = kv.Value
					}
				case *instructions.RunCommand:
					buildRuns += strings.Join(c.CmdLine, " ") + "\n"
				}
			}
			for k, v := range im.buildEnv {
				if buildEnv[k] != v {
					t.Errorf("build stage %q sets %s=%q, want %q", build.Name, k, buildEnv[k], v)
				}
			}
			for _, want := range im.buildRuns {
				if !strings.Contains(buildRuns, want) {
					t.Errorf("build stage %q never runs %q", build.Name, want)
				}
			}
			if strings.Contains(buildRuns, "go build") && !strings.Contains(buildRuns, `-ldflags=-s -w`) && !strings.Contains(buildRuns, `-ldflags="-s -w"`) {
				t.Errorf("build stage %q does not strip the binary (-ldflags=\"-s -w\")", build.Name)
			}

			if im.runs == nil && len(runs) > 0 {
				t.Errorf("final stage runs %q; its base has no shell", runs)
			}
			for _, want := range im.runs {
				if !strings.Contains(strings.Join(runs, "\n"), want) {
					t.Errorf("final stage never installs %q", want)
				}
			}

			uid, gid, _ := strings.Cut(user, ":")
			if n, err := strconv.Atoi(uid); err != nil || n != ImageUID {
				t.Errorf("final stage runs as %q, want the numeric user %d", user, ImageUID)
			}
			if gid != "" {
				if n, err := strconv.Atoi(gid); err != nil || n == 0 {
					t.Errorf("final stage runs with group %q, want a numeric non-root group", gid)
				}
			}
			if len(exposed) != 1 || exposed[0] != env["PARLEY_PORT"]+"/tcp" {
				t.Errorf("final stage exposes %q with PARLEY_PORT=%q; want that port alone, /tcp", exposed, env["PARLEY_PORT"])
			}
			if env["PARLEY_HOST"] != "0.0.0.0" {
				t.Errorf("PARLEY_HOST=%q, want 0.0.0.0 (the server's default listens on loopback only)", env["PARLEY_HOST"])
			}
			if len(volumes) != 1 || volumes[0] != "/models" || !strings.HasPrefix(env["PARLEY_MODEL"], "/models/") || !strings.HasPrefix(env["PARLEY_CACHE"], "/models/") {
				t.Errorf("volumes %q, PARLEY_MODEL=%q, PARLEY_CACHE=%q; want both under the volume /models", volumes, env["PARLEY_MODEL"], env["PARLEY_CACHE"])
			}
			if !onPID || len(entrypoint) != 1 || !strings.HasSuffix(entrypoint[0], "/parley") {
				t.Errorf("ENTRYPOINT %q, want the parley binary alone, in exec form", entrypoint)
			}
			if len(cmd) != 1 || cmd[0] != "serve" {
				t.Errorf("CMD %q, want serve", cmd)
			}
			switch {
			case health == nil:
				t.Error("no HEALTHCHECK instruction (HEALTHCHECK NONE says there is deliberately none)")
			case !im.health:
				if health.Health == nil || len(health.Health.Test) != 1 || health.Health.Test[0] != "NONE" {
					t.Errorf("HEALTHCHECK %q, want NONE", health.Health.Test)
				}
			default:
				test := health.Health.Test
				if len(test) < 2 || test[0] != "CMD" || !strings.Contains(strings.Join(test, " "), "/health") {
					t.Errorf("HEALTHCHECK %q, want an exec-form command that probes /health", test)
				}
				if health.Health.StartPeriod == 0 {
					t.Error("HEALTHCHECK has no start period for loading the models")
				}
			}
		})
	}
}

// expand substitutes the Dockerfile's global ARG defaults in s.
func (p parsed) expand(s string) string {
	args := map[string]string{}
	for _, a := range p.metaArgs {
		for _, kv := range a.Args {
			if kv.Value != nil {
				args[kv.Key] = *kv.Value
			}
		}
	}
	return os.Expand(s, func(k string) string { return args[k] })
}

// stage returns the stage called name, nil if there is none.
func (p parsed) stage(name string) *instructions.Stage {
	for i := range p.stages {
		if name != "" && strings.EqualFold(p.stages[i].Name, name) {
			return &p.stages[i]
		}
	}
	return nil
}
