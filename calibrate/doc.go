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
//   - Fit to vLLM request logs (replay.go, logkv.go, fitlog.go, fidelity.go):
//     ReadLog builds the engine configuration from the log's own contents
//     (meta.json, timeseries.csv; never the directory's name), taking the KV
//     cache size from meta.json, the usage series, the roofline of a named
//     GPU, or the log's proof that sequences limited the batch, and refusing
//     with the flag to pass otherwise (logKVBlocks). FitLogs replays the
//     logged arrivals through the engine model and searches the seven
//     profile terms (log scale: a scale scan refined by golden section, then
//     Nelder-Mead from gonum/optimize) to minimise the mean absolute log
//     ratio of predicted to measured TTFT and E2E, a symmetric objective;
//     each term gets a 95% interval from the SVD of the Jacobian and an
//     identifiability verdict, and the unfitted preset and the one-scale
//     preset are scored beside the fit, on the fitted, held-out and
//     --validate runs, by phase and by load. Fidelity and
//     WriteFidelityMarkdown produce docs/fidelity.md.
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
