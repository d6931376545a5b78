// Package kvevents speaks vLLM's KV cache event protocol: the msgpack payload
// (EventBatch of BlockStored, BlockRemoved and AllBlocksCleared) and its
// ZeroMQ transport (a PUB stream of [topic, seq, payload] frames plus a
// ROUTER that replays recent batches), byte for byte as vLLM sends it.
//
// The mock engine publishes its engine.KVEvent values with a Publisher; the
// router's live mode consumes real or mock engines with a Subscriber, which
// detects sequence gaps (repairing them by replay when the engine offers a
// replay endpoint) and publisher restarts.
//
// Start with Event and Batch (event.go), then EncodeBatch and DecodeBatch
// (codec.go), which define the wire format and document every choice; Config
// and ParseConfig (config.go) read vLLM's --kv-events-config JSON; Publisher
// (publisher.go) and Subscriber (subscriber.go) move batches over ZeroMQ using
// the pure-Go github.com/go-zeromq/zmq4.
//
// Hashes: vLLM sends each block hash as a msgpack int holding the low 64 bits
// (big-endian) of its digest, or the raw digest bytes when
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0. The engine's 128-bit kvblock.Hash is
// sent as its low half, Hash.Lo, an unsigned 64-bit int (see EngineHash).
package kvevents
