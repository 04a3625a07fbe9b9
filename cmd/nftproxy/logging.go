package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"

	// The JSON log format (--logging-format=json, logging.format: json),
	// registered as upstream kube-proxy registers it.
	_ "k8s.io/component-base/logs/json/register"
)

// copyLoggingFlags applies the logging flags given on the command line to a
// configuration read from --config, as upstream does: the flags win, and
// the flags' vmodule patterns come before the file's.
func copyLoggingFlags(from *pflag.FlagSet, to *logsapi.LoggingConfiguration) error {
	var clone pflag.FlagSet
	logsapi.AddFlags(to, &clone)
	fileVModule := to.VModule
	to.VModule = nil
	var errs []error
	clone.VisitAll(func(f *pflag.Flag) {
		given := from.Lookup(f.Name)
		if given == nil || !given.Changed {
			return
		}
		if err := f.Value.Set(given.Value.String()); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", f.Name, err))
		}
	})
	to.VModule = append(to.VModule, fileVModule...)
	return errors.Join(errs...)
}

// loggingFlagOf names the flag of each logging field, for error messages.
var loggingFlagOf = map[string]string{
	"logging.format":                      "--logging-format",
	"logging.flushFrequency":              "--log-flush-frequency",
	"logging.verbosity":                   "-v",
	"logging.vmodule":                     "--vmodule",
	"logging.options.text.splitStream":    "--log-text-split-stream",
	"logging.options.text.infoBufferSize": "--log-text-info-buffer-size",
	"logging.options.json.splitStream":    "--log-json-split-stream",
	"logging.options.json.infoBufferSize": "--log-json-info-buffer-size",
}

// validateLogging applies upstream's checks of the logging configuration
// (known format, flush frequency, vmodule only with text, options behind
// their feature gates); each error names its flag and field.
func validateLogging(c *logsapi.LoggingConfiguration, gate featuregate.FeatureGate) error {
	var errs []error
	for _, e := range logsapi.Validate(c, gate, field.NewPath("logging")) {
		flag := loggingFlagOf[strings.Split(e.Field, "[")[0]]
		if flag == "" {
			errs = append(errs, e)
			continue
		}
		errs = append(errs, fmt.Errorf("%s / %w", flag, e))
	}
	return errors.Join(errs...)
}

// applyLogging configures klog from the configuration (once per process,
// as component-base allows). The JSON format writes to stderr, or, with
// split streams, info messages to stdout.
func applyLogging(c *logsapi.LoggingConfiguration, gate featuregate.FeatureGate, stdout, stderr io.Writer) error {
	opts := &logsapi.LoggingOptions{ErrorStream: stderr, InfoStream: stdout}
	if err := logsapi.ValidateAndApplyWithOptions(c, opts, gate); err != nil {
		return fmt.Errorf("logging: %w", err)
	}
	return nil
}
