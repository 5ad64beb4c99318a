package nats

import (
	"io"
	"log"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/dedupkit/dedupkit/internal/testenv"
)

func TestMain(m *testing.M) {
	// the transactional tests cut MySQL connections on purpose: not news
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	testenv.Main(m, nil)
}
