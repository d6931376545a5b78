// Package storetest is the conformance suite of tenancy.Store: every
// backend's tests call Run, so the backends behave alike (the pattern
// TensorZero uses for its stores).
//
// Start with Run (storetest.go) and the contract of its open function,
// then Inspector, which a backend's test wrapper implements so the suite
// can read what was persisted (no plaintext secret anywhere, migrations
// not re-applied on reopen). The checks follow Run, one function per
// subtest. tenancy/sqlstore's tests show both wrappers.
package storetest
