package redisstore

import (
	"testing"

	"github.com/dedupkit/dedupkit/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }
