// Package kvevents speaks vLLM's KV cache event protocol: the msgpack payload
// (EventBatch of BlockStored, BlockRemoved and AllBlocksCleared) and its
// ZeroMQ transport (a PUB stream of [topic, seq, payload] frames plus a
// ROUTER that replays recent batches), byte for byte as vLLM sends it.
//
// The mock engine publishes its engine.KVEvent values with a Publisher; the
// router's live mode consumes real or mock engines with a Subscriber, which
// detects sequence gaps (repairing them by replay when the engine offers a
// replay endpoint) and publisher restarts. For llm-d's central mode, where
// one bound socket receives every engine's publisher on its own topic
// (kv@<pod-ip>:<port>@<model>), a Mux does what a Subscriber does for each
// topic separately, with the topic's own replay endpoint and goroutine.
//
// Start with Event and Batch (event.go), then EncodeBatch and DecodeBatch
// (codec.go), which define the wire format and document every choice; Config
// and ParseConfig (config.go) read vLLM's --kv-events-config JSON; Publisher
// (publisher.go), Subscriber (subscriber.go) and Mux (mux.go) move batches
// over ZeroMQ using the pure-Go github.com/go-zeromq/zmq4.
//
// Hashes: vLLM sends each block hash as a msgpack int holding the low 64 bits
// (big-endian) of its digest, or the raw digest bytes when
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0. The engine's 128-bit kvblock.Hash is
// sent as its low half, Hash.Lo, an unsigned 64-bit int (see EngineHash).
//
// Parent 0: a BlockStored whose prefix starts at the first block has no
// parent. vLLM sends parent_block_hash None; llm-d-inference-sim sends the
// int 0 (llm-d's EmptyBlockHash) in its default array-encoded events. Both,
// and empty or all-zero bytes, decode as ParentBlockHash nil, so a consumer
// does not wait for a parent block that never existed; EncodeBatch sends a
// zero parent as None.
//
// Who binds: vLLM's publisher binds its PUB endpoint when it contains "*"
// or "::" or is ipc:// or inproc://, and connects otherwise (see Binds).
// llm-d deploys it connecting: the router binds and the engines connect, as
// llm-d-inference-sim's publisher always does. A Subscriber dials Endpoint
// by default; with SubscriberConfig.Bind it listens there instead (Addr
// reports the port chosen for port 0) and publishers connect to it; a Mux
// always binds. Replay always dials the engine's ROUTER, which always binds.
//
// Replay: a DEALER sends ["", start_seq (8-byte big-endian)] and the ROUTER
// answers with every buffered batch with seq >= start_seq, then an end
// marker with seq -1 and an empty payload. The DEALER receives one of two
// shapes:
//
//	vLLM >= 0.26 (PR #45177), llm-d-inference-sim:  ["", topic, seq, payload] ... ["", "", -1, ""]
//	vLLM < 0.26:                                    ["", seq, payload] ...        ["", -1, ""]
//
// Subscriber reads both. Publisher sends the first, as current vLLM does and
// llm-d's replay client requires; Config.LegacyReplay selects the second.
package kvevents
