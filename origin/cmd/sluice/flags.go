package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// errUsage marks a command-line mistake (exit status 2).
var errUsage = errors.New("usage error")

func exitCode(err error) int {
	if errors.Is(err, errUsage) {
		return 2
	}
	return 1
}

// newFlags returns a flag set whose help lists each flag's SLUICE_ variable.
func newFlags(name, summary string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: sluice %s [flags]\n\n%s\n\nFlags (each also read from its environment variable; a flag wins):\n", name, summary)
		fs.VisitAll(func(f *flag.Flag) {
			def := ""
			if f.DefValue != "" && f.DefValue != "false" {
				def = fmt.Sprintf(" (default %s)", f.DefValue)
			}
			fmt.Fprintf(stderr, "  --%-26s %s%s\n      env %s\n", f.Name, f.Usage, def, envName(f.Name))
		})
	}
	return fs
}

func envName(flagName string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parse parses args, then fills every flag not given on the command line
// from its SLUICE_ environment variable.
func parse(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: %w", strayArg(fs.Arg(0)), errUsage)
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		if v := getenv(envName(f.Name)); v != "" {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, errors.New(wanted(withoutValues(fmt.Sprintf("%s: %v", envName(f.Name), err)), f)))
			}
		}
	})
	if len(errs) > 0 {
		return fmt.Errorf("%w (see sluice %s --help): %w", errors.Join(errs...), fs.Name(), errUsage)
	}
	return nil
}

// byteSize is a flag holding a size like 256KiB, 1MiB or 4096.
type byteSize int64

func (b *byteSize) String() string {
	switch v := int64(*b); {
	case v > 0 && v%(1<<20) == 0:
		return strconv.FormatInt(v>>20, 10) + "MiB"
	case v > 0 && v%(1<<10) == 0:
		return strconv.FormatInt(v>>10, 10) + "KiB"
	default:
		return strconv.FormatInt(v, 10)
	}
}

// maxByteSize bounds --max-body far below where a batch's limit, 16 times
// it, would overflow.
const maxByteSize = 1 << 30

func (b *byteSize) Set(s string) error {
	units := []struct {
		suffix string
		mult   int64
	}{{"MiB", 1 << 20}, {"KiB", 1 << 10}, {"MB", 1_000_000}, {"KB", 1000}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = v, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n <= 0 || n > maxByteSize/mult {
		return errors.New("want a positive size up to 1024MiB, such as 256KiB, 1MiB or 65536")
	}
	*b = byteSize(n * mult)
	return nil
}

// parseFlags is fs.Parse, with a mistake told in one line that names the
// flag as the docs spell it, not the whole flag list in front of Go's
// "-flag" spelling; --help still prints the list (and returns flag.ErrHelp).
func parseFlags(fs *flag.FlagSet, args []string) error {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.Usage = usage
	fs.SetOutput(out)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		usage()
		return err
	}
	msg := withoutValues(dashes(err.Error()))
	if m := badValue.FindStringSubmatch(msg); m != nil {
		msg = wanted(msg, fs.Lookup(m[1]))
	}
	return fmt.Errorf("%s (see sluice %s --help): %w", msg, fs.Name(), errUsage)
}

// badValue finds the flag in the flag package's "invalid value … for flag
// --name: …" (and "invalid boolean value … for --name: …").
var badValue = regexp.MustCompile(`for (?:flag )?--([A-Za-z0-9-]+): `)

// wanted replaces the flag package's bare "parse error" in msg with the
// form f takes, so a mistake says how to put it right.
func wanted(msg string, f *flag.Flag) string {
	if f == nil || !strings.HasSuffix(msg, "parse error") {
		return msg
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return msg
	}
	var want string
	switch g.Get().(type) {
	case time.Duration:
		want = "want a duration such as 500ms, 30s or 2m"
	case bool:
		want = "want true or false"
	case int, int64, uint, uint64:
		want = "want a whole number"
	case float64:
		want = "want a number"
	default:
		return msg
	}
	return strings.TrimSuffix(msg, "parse error") + want
}

// quoted is a Go-quoted string, escaped quotes and all.
var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// withoutValues drops the values the flag package quotes in its errors
// ("invalid value "…" for flag"): one given to the wrong flag may be a
// secret or a token of any form, and the operator knows what they typed.
func withoutValues(msg string) string {
	return quoted.ReplaceAllString(msg, "(not shown)")
}

// dashes spells the flag package's "-name" as "--name", as sluice's help
// and docs do.
func dashes(msg string) string {
	for _, before := range []string{"flag ", "defined: ", "argument: ", "for "} {
		msg = strings.ReplaceAll(msg, before+"-", before+"--")
	}
	return msg
}

// strayArg describes an argument no command takes. Only one that reads
// as a mistyped word (a command, a flag's name) is repeated: anything else
// may be a secret or a token, of any form, and the line may end up in a log.
func strayArg(arg string) string {
	if !plainWord.MatchString(arg) {
		return "unexpected argument (not shown: it may be a secret; flags start with --)"
	}
	return fmt.Sprintf("unexpected argument %q", arg)
}

// plainWord is a short word of lowercase letters and dashes.
var plainWord = regexp.MustCompile(`^[a-z][a-z-]{0,23}$`)
