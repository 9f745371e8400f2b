package main

import (
	"context"
	"fmt"
	"os"

	"github.com/nodeward/nodeward/internal/ledgerplans"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
)

func main() {
	ctx := context.Background()
	db, err := models.Open(ctx, models.Options{URL: os.Args[1], MaxOpenConns: 2})
	if err != nil {
		panic(err)
	}
	st := models.NewLedgerStore(models.NewFleetStore(db, "x", nil)).Statements()
	for _, f := range []ledger.Filter{{State: "failed", Limit: 100}, {Kind: "node.prepare_image", Limit: 100}, {State: "failed", Kind: "node.prepare_image", Limit: 100}} {
		s := st.List(f)
		p, err := ledgerplans.Explain(ctx, db, ledgerplans.Query{Name: "x", Statement: s})
		if err != nil {
			panic(err)
		}
		fmt.Println(s.SQL, s.Args)
		fmt.Println(p.Custom.Text)
	}
}
