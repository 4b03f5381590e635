package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.yaml.in/yaml/v3"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/internal/boundedfile"
	"github.com/leafbus/leafbus/pools"
)

// Where a setting comes from, strongest first: the command line, LEAFBUS_<NAME>, the
// --config file, --leaf-properties, the default. Each layer sets only the flags the
// layers above it left alone, so the rules between flags (checkGiven, Validate) judge
// the result whatever layer a value came from.
//
// The --config file is YAML: one mapping whose keys are flag names (without the dashes
// in front) and whose values are what the flag would take; --pool takes a list.
//
//	nats: nats://n1:4222,nats://n2:4222
//	segment-store: mysql
//	pool:
//	  - segment:orders:1000:64
//
// YAML because the project already depends on go.yaml.in/yaml/v3 (its tests read the
// compose file with it), and because it is what Kubernetes ConfigMaps and Helm values
// hold; a key that is no flag is an error, so a typo is never silently ignored.

// configControl are the flags that decide how the configuration is read; a --config
// file may not set them (--leaf-properties it may).
var configControl = []string{"config", "print-config"}

// maxConfigFileBytes bounds a --config file, and a --leaf-properties file: a few
// kilobytes in use.
const maxConfigFileBytes = 4 << 20

// readConfigFile reads a --config file into flag values, checked against fs.
func readConfigFile(path string, fs *flag.FlagSet) (map[string][]string, error) {
	data, err := boundedfile.Read("--config", path, maxConfigFileBytes)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("--config %s: %w", path, err)
	}
	values := map[string][]string{}
	if len(doc.Content) == 0 {
		return values, nil // an empty file sets nothing
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("--config %s: want a mapping of flag names to values, e.g. \"segment-store: mysql\"", path)
	}
	var errs []error
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		name := k.Value
		f := fs.Lookup(name)
		switch {
		case f == nil:
			errs = append(errs, fmt.Errorf("--config %s line %d: %q is not a flag of dispenser (see --help)", path, k.Line, name))
			continue
		case slices.Contains(configControl, name):
			errs = append(errs, fmt.Errorf("--config %s line %d: %q can only be given on the command line or as %s", path, k.Line, name, envName(name)))
			continue
		case values[name] != nil:
			errs = append(errs, fmt.Errorf("--config %s line %d: %q appears twice", path, k.Line, name))
			continue
		}
		_, repeatable := f.Value.(*pools.Specs)
		switch {
		case v.Kind == yaml.ScalarNode && v.Tag == "!!null":
			values[name] = []string{""}
		case v.Kind == yaml.ScalarNode:
			values[name] = []string{v.Value}
		case v.Kind == yaml.SequenceNode && repeatable:
			list := []string{}
			for _, item := range v.Content {
				if item.Kind != yaml.ScalarNode {
					errs = append(errs, fmt.Errorf("--config %s line %d: each %s is one value", path, item.Line, name))
					continue
				}
				list = append(list, item.Value)
			}
			values[name] = list
		default:
			errs = append(errs, fmt.Errorf("--config %s line %d: %s takes one value, not a list or mapping", path, v.Line, name))
		}
	}
	return values, errors.Join(errs...)
}

// applyValues sets each flag of values that given does not hold yet, marking it given
// and recording where it came from.
func applyValues(fs *flag.FlagSet, values map[string][]string, given map[string]string, from func(name string) string) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(values)) {
		if _, ok := given[name]; ok {
			continue
		}
		for _, v := range values[name] {
			if err := fs.Set(name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: --%s %q: %w", from(name), name, masked(name, v), err))
			}
		}
		given[name] = from(name)
	}
	return errors.Join(errs...)
}

// secretFlags are masked by --print-config.
var secretFlags = []string{"password", "service-password", "token", "service-token"}

// printConfig writes the configuration fs holds as a --config file: each flag a value
// came for, with a comment saying where from, then the flags left at their defaults as
// comments, so that the output given back as --config starts the same dispenser.
// Secrets are masked (the passwords and tokens, the password in --mysql-dsn,
// credentials in --nats URLs); the control flags are left out.
func printConfig(w io.Writer, fs *flag.FlagSet, sources map[string]string) error {
	var set, defaults bytes.Buffer
	set.WriteString("# dispenser --print-config: the configuration in effect, as a --config file.\n" +
		"# Each value comes from (strongest first) the command line, LEAFBUS_<NAME>, --config\n" +
		"# or --leaf-properties, as its comment says; secrets are masked.\n")
	defaults.WriteString("# Defaults:\n")
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if slices.Contains(configControl, f.Name) || err != nil {
			return
		}
		var v string
		if v, err = yamlValue(f); err != nil {
			return
		}
		if from, ok := sources[f.Name]; ok {
			fmt.Fprintf(&set, "%s: %s # %s\n", f.Name, v, from)
		} else {
			fmt.Fprintf(&defaults, "# %s: %s\n", f.Name, v)
		}
	})
	if err != nil {
		return fmt.Errorf("--print-config: %w", err)
	}
	_, err = w.Write(append(set.Bytes(), defaults.Bytes()...))
	return err
}

// yamlValue is a flag's value as YAML: numbers, booleans and durations plain, strings
// quoted where YAML needs it, --pool a flow list.
func yamlValue(f *flag.Flag) (string, error) {
	if specs, ok := f.Value.(*pools.Specs); ok {
		items := make([]string, 0, len(*specs))
		for _, sp := range *specs {
			b, err := yaml.Marshal(sp.String())
			if err != nil {
				return "", err
			}
			items = append(items, strings.TrimSuffix(string(b), "\n"))
		}
		return "[" + strings.Join(items, ", ") + "]", nil
	}
	if g, ok := f.Value.(flag.Getter); ok {
		switch g.Get().(type) {
		case bool, int, int64, uint, uint64, float64, time.Duration:
			return f.Value.String(), nil
		}
	}
	b, err := yaml.Marshal(masked(f.Name, f.Value.String()))
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(string(b), "\n"), nil
}

// masked is a flag's value as --print-config and errors show it: the one place that
// knows which flags hold secrets and how to cut them out of a value.
func masked(name, value string) string {
	const mask = "*****"
	switch {
	case value == "":
		return value
	case slices.Contains(secretFlags, name):
		return mask
	case name == "mysql-dsn":
		cfg, err := mysql.ParseDSN(value)
		if err != nil {
			return mask // unreadable: it may hold the password anywhere
		}
		if cfg.Passwd != "" {
			cfg.Passwd = mask
		}
		return cfg.FormatDSN()
	case name == "nats":
		return client.RedactURLs(value)
	}
	return strings.TrimSpace(value)
}
