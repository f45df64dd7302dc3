package main

import (
	"testing"

	"github.com/eventfeed/subscriptions/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }
