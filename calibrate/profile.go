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
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("write profile: %w", err)
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("write profile: %w", err)
	}
	header := "# inferrail engine profile (written by inferrail calibrate).\n" +
		"# Step time T = step_fixed + prefill_token*prefill_tokens\n" +
		"#             + prefill_pair*sum(new*(ctx+new/2)) + decode_seq*decode_seqs\n" +
		"#             + decode_ctx_token*decode_ctx_tokens\n"
	if _, err := io.WriteString(w, header); err != nil {
		return fmt.Errorf("write profile: %w", err)
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("write profile: %w", err)
	}
	return nil
}

// SaveProfile writes cfg to path (see WriteProfile).
func SaveProfile(path string, cfg engine.Config) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write profile: %w", err)
	}
	if err := WriteProfile(f, cfg); err != nil {
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
	return engine.Config{}, fmt.Errorf("profile %q: no such file, and not a preset (MODEL@GPU, for example %s)", arg, PresetNames()[0])
}
