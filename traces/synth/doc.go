// Package synth generates request traces with long prompts and heavy prefix
// reuse, of the kind production chat and agent traffic has (the Mooncake
// traces' kind), in the Mooncake JSON-lines format the traces package
// reads: one request a line with timestamp (ms), input_length,
// output_length and hash_ids (one id per block of Config.BlockTokens
// tokens; equal ids mean identical prefixes).
//
// The model, every parameter of which is a Config field: requests arrive
// by a renewal process (Poisson, or burstier with ArrivalCV > 1); each
// either opens a new session (with probability NewSession, or when no
// session is active) or continues one of the ActiveSessions most recent
// sessions, picked uniformly. A new session starts with one of Prefixes
// shared system prompts of PrefixTokens (picked by a Zipf law of exponent
// PrefixZipf) and a first message of lognormal length (InputMedian,
// InputSigma); a continued session's prompt is its previous prompt and
// answer plus a new message of lognormal length (TurnMedian, TurnSigma),
// so later turns share everything but their last message with the
// earlier ones. A session whose next prompt would pass InputMax ends, and
// the request opens a new one. Answers are lognormal (OutputMedian,
// OutputSigma), at most OutputMax. The same Config and seed give the same
// bytes.
//
// Start with Config and Generate.
package synth
