package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"go.yaml.in/yaml/v3"

	"github.com/parleyhq/parley/runtime/models/llama"
)

// A config file (--config FILE, or $PARLEY_CONFIG) says what flags say: its keys are the
// command's flags by their long names (port, kv-mem, model...), with TOML's or YAML's types
// (a number, a boolean, a string, a duration as a string such as "10m", a list for a repeatable
// flag). A table named after a command (serve, generate...) holds keys for that command only,
// so that one file serves several; serve also takes a list of models, each with its alias and
// options of its own (serveModel). A value the command line or a variable gives wins over the
// file's: the command line first, then PARLEY_*, then the file, then the flag's default. An
// unknown key, or a value of the wrong type, is a usage error (exit status 2) that names the
// file and the key.

// configFile is a decoded config file: its name for messages and its top-level keys.
type configFile struct {
	name string
	keys map[string]any
}

// readConfig decodes the TOML (.toml) or YAML (.yaml, .yml) file at path.
func readConfig(path string) (*configFile, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, usagef("--config %s: no such file", path)
	}
	if err != nil {
		return nil, err
	}
	keys := map[string]any{}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".toml":
		if _, err := toml.NewDecoder(bytes.NewReader(b)).Decode(&keys); err != nil {
			return nil, usagef("%s: %v", path, err)
		}
	case ".yaml", ".yml":
		var doc any
		if err := yaml.Unmarshal(b, &doc); err != nil {
			return nil, usagef("%s: %v", path, err)
		}
		switch d := doc.(type) {
		case nil: // an empty file
		case map[string]any:
			keys = d
		default:
			return nil, usagef("%s: want a mapping of keys to values at the top, got %T", path, doc)
		}
	default:
		return nil, usagef("--config %s: want a .toml, .yaml or .yml file", path)
	}
	return &configFile{name: path, keys: keys}, nil
}

// configValue returns the strings that flag.Value.Set takes for v, one per element of a list
// (a list only for a repeatable flag).
func configValue(v any, repeat bool) ([]string, error) {
	switch x := v.(type) {
	case string:
		return []string{x}, nil
	case bool:
		return []string{strconv.FormatBool(x)}, nil
	case int:
		return []string{strconv.Itoa(x)}, nil
	case int64:
		return []string{strconv.FormatInt(x, 10)}, nil
	case uint64:
		return []string{strconv.FormatUint(x, 10)}, nil
	case float64:
		return []string{strconv.FormatFloat(x, 'g', -1, 64)}, nil
	case []any:
		if !repeat {
			return nil, errors.New("a list, for a flag that takes one value")
		}
		var out []string
		for _, e := range x {
			s, err := configValue(e, false)
			if err != nil {
				return nil, err
			}
			out = append(out, s...)
		}
		return out, nil
	case map[string]any:
		return nil, errors.New("a table, for a flag that takes a value")
	}
	return nil, fmt.Errorf("a value of type %T", v)
}

// applyConfig sets from c every flag that neither the command line nor a variable gave (given),
// reading the top-level keys and then the table named after the command, whose keys win. The
// key models is the command's models list when f takes one (f.models). Every key must be a flag
// of the command (or a table named after a command, or models).
func (f *flags) applyConfig(c *configFile, given map[string]bool) error {
	cmd := f.FlagSet.Name()
	top := map[string]any{}
	for k, v := range c.keys {
		if _, isCmd := commands[k]; isCmd {
			if _, ok := v.(map[string]any); !ok {
				return usagef("%s: %s: want a table of %s's flags", c.name, k, k)
			}
			continue
		}
		top[k] = v
	}
	sets := []map[string]any{top}
	if t, ok := c.keys[cmd].(map[string]any); ok {
		sets = append(sets, t)
	}
	for i, set := range sets {
		where := c.name
		if i == 1 {
			where += ": " + cmd
		}
		keys := make([]string, 0, len(set))
		for k := range set {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			v := set[k]
			if k == "models" && f.models != nil {
				list, ok := v.([]any)
				if ms, isTables := v.([]map[string]any); isTables { // TOML's [[models]]
					list, ok = make([]any, len(ms)), true
					for j, m := range ms {
						list[j] = m
					}
				}
				if !ok {
					return usagef("%s: models: want a list of models (tables with path, alias and options)", where)
				}
				*f.models = nil
				for j, e := range list {
					m, ok := e.(map[string]any)
					if !ok {
						return usagef("%s: models[%d]: want a table (path, alias and options)", where, j)
					}
					*f.models = append(*f.models, configModel{where: fmt.Sprintf("%s: models[%d]", where, j), keys: m})
				}
				continue
			}
			fl := f.Lookup(k)
			if fl == nil || k == "config" || len(k) == 1 {
				return usagef("%s: unknown key %q (%s)", where, k, f.knownKeys())
			}
			if given[k] {
				continue // the command line or a variable gave it
			}
			_, repeat := fl.Value.(repeatable)
			vals, err := configValue(v, repeat)
			if err != nil {
				return usagef("%s: %s: %v", where, k, err)
			}
			if repeat && i == 1 {
				if r, ok := fl.Value.(interface{ reset() }); ok {
					r.reset() // the command's table replaces the top-level list
				}
			}
			for _, s := range vals {
				if err := f.Set(k, s); err != nil {
					return usagef("%s: invalid value %q for key %s: %v", where, s, k, err)
				}
			}
			f.fromFile[k] = where
		}
	}
	return nil
}

// knownKeys lists the keys a config file may hold for the command, for the error of an unknown
// one.
func (f *flags) knownKeys() string {
	var keys []string
	f.VisitAll(func(fl *flag.Flag) {
		if _, isShort := f.long[fl.Name]; !isShort && fl.Name != "config" {
			keys = append(keys, fl.Name)
		}
	})
	if f.models != nil {
		keys = append(keys, "models")
	}
	slices.Sort(keys)
	return "the keys of " + f.FlagSet.Name() + ": " + strings.Join(keys, ", ") + "; or a table named after a command"
}

// configModel is one entry of a config file's models list.
type configModel struct {
	where string // file: models[i], for messages
	keys  map[string]any
}

// modelOptions are a served model's options: the flags' values, or the config file's for one
// model.
type modelOptions struct {
	ctx, parallel, kvMiB, stepTokens, queue int
	kvType, chatTemplate                    string
	prefix                                  bool
	asrParallel, asrQueue, asrEncode        int
	onDemand                                bool          // loaded on its first request, unloaded when idle
	keepAlive                               time.Duration // an on-demand model's idle time before it is unloaded
}

// modelOptionKeys are the keys of a models entry besides path and alias: the flags of serve
// that a model may have its own value of.
var modelOptionKeys = []string{"asr-encode-batch", "asr-parallel", "asr-queue", "chat-template", "ctx", "keep-alive", "kv-mem", "kv-type", "on-demand", "parallel", "prefix-cache", "queue", "step-tokens"}

// options reads m's path, alias and options, the options defaulting to def (the flags').
func (m configModel) options(def modelOptions) (path, alias string, o modelOptions, err error) {
	o = def
	fs := flag.NewFlagSet("model", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&path, "path", "", "")
	fs.StringVar(&alias, "alias", "", "")
	fs.IntVar(&o.ctx, "ctx", def.ctx, "")
	fs.IntVar(&o.parallel, "parallel", def.parallel, "")
	fs.IntVar(&o.kvMiB, "kv-mem", def.kvMiB, "")
	fs.IntVar(&o.stepTokens, "step-tokens", def.stepTokens, "")
	fs.IntVar(&o.queue, "queue", def.queue, "")
	fs.StringVar(&o.kvType, "kv-type", def.kvType, "")
	fs.StringVar(&o.chatTemplate, "chat-template", def.chatTemplate, "")
	fs.BoolVar(&o.prefix, "prefix-cache", def.prefix, "")
	fs.IntVar(&o.asrParallel, "asr-parallel", def.asrParallel, "")
	fs.IntVar(&o.asrQueue, "asr-queue", def.asrQueue, "")
	fs.IntVar(&o.asrEncode, "asr-encode-batch", def.asrEncode, "")
	fs.BoolVar(&o.onDemand, "on-demand", def.onDemand, "")
	fs.Var((*keepAliveFlag)(&o.keepAlive), "keep-alive", "")
	keys := make([]string, 0, len(m.keys))
	for k := range m.keys {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if fs.Lookup(k) == nil {
			return "", "", o, usagef("%s: unknown key %q (a model takes path, alias, %s)", m.where, k, strings.Join(modelOptionKeys, ", "))
		}
		vals, err := configValue(m.keys[k], false)
		if err != nil {
			return "", "", o, usagef("%s: %s: %v", m.where, k, err)
		}
		if err := fs.Set(k, vals[0]); err != nil {
			return "", "", o, usagef("%s: invalid value %q for key %s: %v", m.where, vals[0], k, err)
		}
	}
	if path == "" {
		return "", "", o, usagef("%s: path is required (a model file or an hf:// name)", m.where)
	}
	return path, alias, o, nil
}

// check reports a models entry's options out of range, as serve's flags are checked.
func (o modelOptions) check(where string) error {
	if o.parallel < 1 || o.stepTokens < 1 || o.queue < 0 || o.ctx < 0 || o.kvMiB < 0 {
		return usagef("%s: parallel and step-tokens must be positive; queue, ctx and kv-mem not negative", where)
	}
	if o.ctx > llama.MaxContextSlots {
		return usagef("%s: ctx %d: want 0 (the model's context) to %d", where, o.ctx, llama.MaxContextSlots)
	}
	if o.asrParallel < 1 || o.asrQueue < 0 || o.asrEncode < 1 || o.asrEncode > min(o.asrParallel, 64) {
		return usagef("%s: asr-parallel must be positive, asr-queue not negative, asr-encode-batch 1..asr-parallel (64 at most)", where)
	}
	return nil
}
