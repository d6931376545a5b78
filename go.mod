module github.com/inferrail/inferrail

go 1.26

require (
	github.com/zeebo/xxh3 v1.1.0
	pgregory.net/rapid v1.3.0
)

require (
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	golang.org/x/sys v0.38.0 // indirect
)
