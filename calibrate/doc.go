// Package calibrate produces engine profiles (engine.Config with its latency
// model engine.Profile) in three ways, and writes them as YAML that
// engine.LoadConfig reads back.
//
//   - Roofline presets (preset.go): Preset("Llama-3.1-70B@4xH100") derives
//     KV capacity and the five step-time coefficients from a model's
//     architecture and a GPU's data sheet, with the efficiency factors named
//     as constants there (EffBandwidth, EffFLOPs, ...); PresetInfo prints the
//     derivation, PresetNames lists MODEL@GPU pairs (tensor parallel size
//     picked by MaxWeightShare).
//   - Fit to a vLLM request log (replay.go, fitlog.go): ReadLog builds the
//     engine configuration from meta.json and FitLog replays the logged
//     arrivals through the engine model, searching the coefficients (log
//     scale, then Nelder-Mead from gonum/optimize) to minimise TTFT and
//     end-to-end relative errors, scoring a held-out tail separately.
//   - Fit to a live server (design.go, lsq.go, probe.go): NewDesign plans cold,
//     cached-prefix and concurrent-decode probes; Probe runs them against an
//     OpenAI-compatible /v1/completions stream; Rows turns measurements into
//     linear observations and FitRows solves them by weighted least squares
//     with standard errors, leaving out rows a busy machine delayed and
//     refusing designs that cannot identify a coefficient. engine_test.go
//     calibrates the real mock engine (engine/server) on virtual time.
//
// Start with FitRows and PrefillRow/DecodeRow (lsq.go) for the model of a
// measurement, then Probe (probe.go); FitLog (fitlog.go) for logs; NewRoofline
// (preset.go) for presets. profile.go holds WriteProfile, SaveProfile (and
// their Fitted forms, which also record every fitted term, the TTFT
// overhead included) and ResolveProfile (a YAML path or a preset name, for
// sim --profile). Streams are read with internal/openai, /metrics with
// fleet/remote's parser.
package calibrate
