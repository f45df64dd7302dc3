package migrations_test

import (
	"log/slog"
	"testing"

	"github.com/eventfeed/subscriptions/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
