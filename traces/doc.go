// Package traces reads and writes request traces: the public production
// traces people cite (Mooncake, Qwen-Bailian, Azure, BurstGPT, ShareGPT), an
// engine's own request logs (vLLM), and the project's own parquet format, all
// into one Record type that the simulator replays.
//
// Start with Record and Reader (trace.go), Open (which picks a reader by
// format), and Source, which turns records into the simulator's requests:
// block identity (Mooncake's 512-token hash_ids, Bailian's 16-token ones)
// becomes segment chains, so equal ids share KV blocks at any engine block
// size.
package traces
