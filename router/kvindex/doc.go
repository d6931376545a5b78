// Package kvindex is the router's KV index: for every candidate replica it
// predicts how many leading blocks of a prompt that replica still holds in
// its engine's prefix cache.
//
// The index keeps two views of the same set of (block, replica) pairs:
//
//   - a shared open-addressing table from block hash to the set of replicas
//     holding it (one 64-bit word for replicas 0..63, a short sparse list of
//     further words beyond), so that Lookup answers all candidates in one walk
//     down the prompt, stopping once no candidate still matches;
//   - per replica, a shadow LRU (an intrusive doubly linked list over a slab
//     of nodes with int32 links, plus a small hash table from block hash to
//     node) bounded by the replica's capacity in blocks.
//
// It is fed in one of two ways. In approximate mode the router records what
// it routed (Record, and TakeBack when the attempt failed before the engine
// computed the prompt). In event-fed mode the engines' KV events arrive as
// Stored and Removed, and the router bridges the delay before the first
// event with RecordSpeculative entries that Stored confirms and Expire drops.
//
// Pinning follows vLLM's reference counts: a request the engine is running
// holds its blocks, which are then out of the free queue and cannot be
// evicted. RecordPinned records a routed prompt and pins its blocks on the
// replica (a pin count per block and replica); Release, when the request
// finishes, unpins them tail first, so that the ones no other request holds
// rejoin the LRU as its most recent blocks, block 0 first. A pinned block is
// in no list, its node keeping its pin count where the links were, so
// eviction never passes over it. Capacity counts pinned blocks too, but
// never evicts them: when every block is pinned, RecordPinned inserts over
// capacity and the excess goes at the next Release.
//
// An Index is safe for concurrent use: Lookup, Blocks, Capacity and Bytes
// take a read lock and never change recency, so lookups do not serialise
// behind each other; everything else takes the write lock. Nothing depends
// on map iteration order or the clock: the caller passes time to
// RecordSpeculative and Expire. With Config.Lane (a simulation on two
// cores) it is for one goroutine instead, and RecordPinned's and Finish's
// work runs on the lane's worker while that goroutine goes on
// (background.go), with the same results; a caller that waits for a long
// job applies its changes to the shared table as the worker makes them.
// There it also chooses, every 1,024 Lookups, whether to keep the shared
// table at all or to answer Lookup from each candidate's own table (adapt:
// whichever the last window's counts say costs the caller less; the answers
// are the same).
//
// Start with Index and its methods (index.go); replica.go holds the shadow
// LRU, table.go the shared table, expiry.go the queue of speculative records,
// background.go the work on a lane, and check_test.go the internal
// consistency check the tests run.
package kvindex
