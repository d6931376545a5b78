package calibrate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/inferrail/inferrail/engine"
)

// WriteProfile writes cfg as a profile YAML that engine.LoadConfig reads
// back, with a header comment naming the latency model.
func WriteProfile(w io.Writer, cfg engine.Config) error {
	return WriteFittedProfile(w, cfg, nil)
}

// WriteFittedProfile writes cfg as WriteProfile does and, when fit is not
// nil, every term the fit estimated in the header: the five profile
// coefficients with their standard errors, and the TTFT overhead, which a
// profile has no field for (it is the client's cost, HTTP, tokenization and
// streaming, that a TTFT measured from the client adds to the engine's
// prefill), so that a profile says all that was measured while
// engine.LoadConfig still reads back exactly cfg.
func WriteFittedProfile(w io.Writer, cfg engine.Config, fit *LinearFit) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("write profile: %w", err)
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("write profile: %w", err)
	}
	var h strings.Builder
	h.WriteString("# inferrail engine profile (written by inferrail calibrate).\n" +
		"# Step time T = step_fixed + prefill_token*prefill_tokens\n" +
		"#             + prefill_pair*sum(new*(ctx+new/2)) + decode_seq*decode_seqs\n" +
		"#             + decode_ctx_token*decode_ctx_tokens\n")
	if fit != nil {
		fmt.Fprintf(&h, "# Fitted by least squares to %d measurements (%d left out as delayed), relative RMS %.2f%%:\n",
			fit.Rows-len(fit.Outliers), len(fit.Outliers), 100*fit.RelRMS)
		for _, c := range fit.Coefficients {
			fmt.Fprintf(&h, "#   %-20s %11.6g ± %.2g", c.Name, c.Value, c.StdErr)
			if c.Clamped {
				h.WriteString(" (fitted below zero: held at 0)")
			}
			h.WriteString("\n")
		}
		fmt.Fprintf(&h, "# %s is the client's: HTTP, tokenization and streaming add it to every TTFT\n"+
			"# measured from a client; no profile field holds it.\n", CoefNames[NumCoefs-1])
	}
	if _, err := io.WriteString(w, h.String()); err != nil {
		return fmt.Errorf("write profile: %w", err)
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("write profile: %w", err)
	}
	return nil
}

// SaveProfile writes cfg to path (see WriteProfile).
func SaveProfile(path string, cfg engine.Config) error {
	return SaveFittedProfile(path, cfg, nil)
}

// SaveFittedProfile writes cfg and the fit's terms to path (see
// WriteFittedProfile).
func SaveFittedProfile(path string, cfg engine.Config, fit *LinearFit) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write profile: %w", err)
	}
	if err := WriteFittedProfile(f, cfg, fit); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// MeasurementsPath is where the measurements behind a profile go: beside it,
// PROFILE.measurements.json (the profile's extension dropped).
func MeasurementsPath(profile string) string {
	base := profile
	for _, ext := range []string{".yaml", ".yml"} {
		if strings.HasSuffix(base, ext) {
			base = strings.TrimSuffix(base, ext)
			break
		}
	}
	return base + ".measurements.json"
}

// SaveJSON writes v as indented JSON to path.
func SaveJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// ResolveProfile accepts a profile YAML file path or a preset name
// (MODEL@GPU, MODEL@NxGPU; see PresetNames) and returns the engine
// configuration. A path that exists wins over a preset of the same name.
func ResolveProfile(arg string) (engine.Config, error) {
	if arg == "" {
		return engine.Config{}, errors.New("profile: empty; give a YAML file or a preset such as Llama-3.1-8B@H100")
	}
	if _, err := os.Stat(arg); err == nil {
		return engine.LoadConfig(arg)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return engine.Config{}, fmt.Errorf("profile: %w", err)
	}
	if strings.Contains(arg, "@") {
		return Preset(arg)
	}
	if strings.HasSuffix(arg, ".yaml") || strings.HasSuffix(arg, ".yml") {
		return engine.LoadConfig(arg) // not found: LoadConfig says so
	}
	return engine.Config{}, fmt.Errorf("profile %q: no such file, and not a preset (MODEL@GPU, for example Llama-3.1-8B@H100; see calibrate --list-presets)", arg)
}

// WriteLogProfile writes a profile fitted to vLLM logs (see FitLogs): the
// configuration as WriteProfile does, with every fitted term in the header,
// its 95% interval, and whether the logs identify it; a term they do not
// identify is marked so, and any value in its interval fits alike.
func WriteLogProfile(w io.Writer, fit *LogFit) error {
	var h strings.Builder
	fmt.Fprintf(&h, "# Fitted by inferrail calibrate --from-log to %s\n# (objective: %s).\n", strings.Join(fit.Logs, ", "), fit.Objective)
	for _, c := range fit.Coefficients {
		if c.Identified {
			fmt.Fprintf(&h, "#   %-20s %11.4g  (95%%: %.4g to %.4g)\n", c.Name, c.Value, c.Lo, c.Hi)
		} else {
			fmt.Fprintf(&h, "#   %-20s not identified: the logs fit alike over %s (written: %.4g)\n", c.Name, c.Interval(), c.Value)
		}
	}
	fmt.Fprintf(&h, "# Fit TTFT MAPE %.2f%%, E2E %.2f%%", fit.Fit.TTFTMAPE, fit.Fit.E2EMAPE)
	if fit.Holdout != nil {
		fmt.Fprintf(&h, "; holdout TTFT %.2f%%, E2E %.2f%%", fit.Holdout.TTFTMAPE, fit.Holdout.E2EMAPE)
	}
	h.WriteString(".\n")
	var b strings.Builder
	if err := WriteProfile(&b, fit.Config); err != nil {
		return err
	}
	if _, err := io.WriteString(w, h.String()+b.String()); err != nil {
		return fmt.Errorf("write profile: %w", err)
	}
	return nil
}

// SaveLogProfile writes fit's profile to path (see WriteLogProfile).
func SaveLogProfile(path string, fit *LogFit) error {
	var b strings.Builder
	if err := WriteLogProfile(&b, fit); err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write profile: %w", err)
	}
	return nil
}
