package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// envPrefix begins the environment variable of every flag.
const envPrefix = "PARLEY_"

// flags is a command's flag set, where every flag is read from the command line and, when the
// command line does not give it, from its environment variable. Every flag has a long name (a
// one-letter flag gets one with alias) and its variable is that name in upper case, '-' written
// '_', after PARLEY_: --kv-mem reads $PARLEY_KV_MEM, -m (--model) reads $PARLEY_MODEL. A
// variable set to "" counts as unset; a repeatable flag's variable holds its values separated by
// commas. Values from either source are parsed by the same flag.Value (booleans as
// strconv.ParseBool parses them), and a bad one is a usage error (exit status 2) that names the
// flag.
type flags struct {
	*flag.FlagSet
	e        *env
	synopsis string
	long     map[string]string // one-letter name → its long name
	short    map[string]string // long name → its one-letter name
	fromEnv  map[string]string // long name → the variable that set it
}

// newFlags makes a command's flag set. Its errors are returned (not printed and exited on); on a
// mistake it prints the usage, and run prints the error itself once, with the command's name.
func newFlags(e *env, name, synopsis string) *flags {
	f := &flags{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), e: e, synopsis: synopsis,
		long: map[string]string{}, short: map[string]string{}, fromEnv: map[string]string{}}
	f.SetOutput(io.Discard) // flag would print the error line too
	f.Usage = f.printUsage
	return f
}

// alias gives the one-letter flag short (already defined) the long name long, on the command
// line and as the name its variable derives from.
func (f *flags) alias(short, long string) {
	fl := f.Lookup(short)
	f.Var(fl.Value, long, fl.Usage)
	f.long[short], f.short[long] = long, short
}

// name is the long name of the flag called n.
func (f *flags) name(n string) string {
	if l, ok := f.long[n]; ok {
		return l
	}
	return n
}

// envVar is the variable of the flag whose long name is name.
func envVar(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// repeatable is a flag.Value that collects every value it is given (-m, --stop...); its variable
// holds them separated by commas.
type repeatable interface{ repeatable() }

// parse reads the command line (flags may follow positional arguments: parley inspect MODEL
// --json), then the variables of the flags it did not give, and returns the positional
// arguments.
func (f *flags) parse(args []string) ([]string, error) {
	var pos []string
	for {
		if err := f.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageError{err}
		}
		args = f.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	given := map[string]bool{}
	f.Visit(func(fl *flag.Flag) { given[f.name(fl.Name)] = true })
	var err error
	f.VisitAll(func(fl *flag.Flag) {
		if _, isShort := f.long[fl.Name]; err != nil || isShort || given[fl.Name] {
			return // a one-letter flag is read under its long name
		}
		name := fl.Name
		key := envVar(name)
		v := os.Getenv(key)
		if v == "" {
			return
		}
		vals := []string{v}
		if _, ok := fl.Value.(repeatable); ok {
			vals = strings.Split(v, ",")
		}
		for _, x := range vals {
			if e := f.Set(fl.Name, x); e != nil {
				err = usagef("invalid value %q for flag -%s from $%s: %v", v, name, key, e)
				return
			}
		}
		f.fromEnv[name] = key
	})
	return pos, err
}

// isSet reports whether the flag called n was given, on the command line or by its variable.
func (f *flags) isSet(n string) bool {
	n = f.name(n)
	set := false
	f.Visit(func(fl *flag.Flag) { set = set || f.name(fl.Name) == n })
	return set
}

// from names where the flag called n got its value, for messages: "$PARLEY_X" when its variable
// gave it, else the flag as written (-t, --kv-type).
func (f *flags) from(n string) string {
	if v, ok := f.fromEnv[f.name(n)]; ok {
		return "$" + v
	}
	if len(n) == 1 {
		return "-" + n
	}
	return "--" + n
}

// printUsage prints the synopsis and every flag with its long name, default and variable.
func (f *flags) printUsage() {
	w := f.e.stderr
	fmt.Fprintf(w, "usage: parley %s %s\n\nflags:\n", f.FlagSet.Name(), f.synopsis)
	var all []*flag.Flag
	f.VisitAll(func(fl *flag.Flag) {
		if f.short[fl.Name] == "" { // a long alias is listed with its letter
			all = append(all, fl)
		}
	})
	sort.Slice(all, func(i, j int) bool { return all[i].Name < all[j].Name })
	for _, fl := range all {
		names := "-" + fl.Name
		if l, ok := f.long[fl.Name]; ok {
			names += ", --" + l
		}
		typ, usage := flag.UnquoteUsage(fl)
		line := "  " + names
		if typ != "" {
			line += " " + typ
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		switch fl.DefValue {
		case "", "0", "false", "0s", "map[]":
		default:
			if typ == "string" {
				line += fmt.Sprintf(" (default %q)", fl.DefValue)
			} else {
				line += fmt.Sprintf(" (default %v)", fl.DefValue)
			}
		}
		fmt.Fprintf(w, "%s ($%s)\n", line, envVar(f.name(fl.Name)))
	}
}
