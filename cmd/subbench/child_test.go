package main

import (
	"fmt"
	"os"
	"testing"
)

// TestMain lets the test binary serve as scenario 7's child process, as
// the subbench binary does (see main): run() spawns os.Executable(), which
// under go test is this binary.
func TestMain(m *testing.M) {
	if conf, ok := os.LookupEnv(appendChildEnv); ok {
		if err := runAppendChild(conf); err != nil {
			fmt.Fprintln(os.Stderr, "subbench child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
