package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/parleyhq/parley/runtime/hub"
)

// runPull downloads hf:// models into the cache and prints the local path of each, the path
// that -m takes offline (a split model's first file).
func runPull(e *env, args []string) error {
	fs := newFlags(e, "pull", "[flags] hf://owner/repo[@rev]/file.gguf | hf://owner/repo[@rev]:QUANT ...")
	cache := fs.String("cache", "", "cache directory (default: the user's cache directory/parley)")
	endpoint := fs.String("hf-endpoint", "", "base URL of the Hugging Face compatible hub (default "+hub.DefaultEndpoint+")")
	quiet := fs.Bool("quiet", false, "no progress bar")
	names, err := fs.parse(args)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return usagef("want at least one hf:// name")
	}
	for _, n := range names {
		if err := hub.CheckName(n); err != nil {
			return usageError{err}
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var progress io.Writer = e.stderr
	if *quiet {
		progress = nil
	}
	for _, n := range names {
		p, err := hub.Resolve(ctx, n, hub.Options{CacheDir: *cache, Endpoint: *endpoint, Progress: progress})
		if err != nil {
			return err
		}
		fmt.Fprintln(e.stdout, p)
	}
	return nil
}
