//go:build race

package tests

// raceBuild: under `go test -race` the binary under test is built with the race detector too, so
// that the servers and commands the tests run report their own data races (startServerEnv and
// runParley fail the test on a report). scripts/test runs only the concurrent tests this way.
const raceBuild = true
