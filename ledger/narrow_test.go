package ledger_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/ledger"
)

// TestNarrow: the listing's family, kind and target_kind filters become
// the (kind, target kind) pairs they leave possible among the served
// kinds; a fan-out kind is indexed under node and fleet; an unknown value
// leaves none (nothing matches); other filters pass untouched.
func TestNarrow(t *testing.T) {
	ks := append(ledger.ServedKinds(nil), ledger.CredentialKinds(nil)...)
	ks = append(ks, ledger.ConfigKinds(nil, nil)...)
	reg := ledger.NewRegistry(append(ks, ledger.EndpointKind(nil, nil))...)
	pairs := func(f ledger.Filter) []ledger.KindTarget { return reg.Narrow(f).Kinds }
	kt := func(k, tk string) ledger.KindTarget { return ledger.KindTarget{Kind: k, TargetKind: tk} }

	require.Nil(t, pairs(ledger.Filter{TargetID: "n1", State: ledger.StateFailed}))
	require.Equal(t, []ledger.KindTarget{kt(ledger.KindFleetCommand, ledger.TargetNode), kt(ledger.KindFleetCommand, ledger.TargetFleet)},
		pairs(ledger.Filter{Family: ledger.FamilyFleet}))
	require.Equal(t, []ledger.KindTarget{kt(ledger.KindFleetCommand, ledger.TargetFleet), kt(ledger.KindFleetConfigure, ledger.TargetFleet),
		kt(ledger.KindFleetDiagnose, ledger.TargetFleet)}, pairs(ledger.Filter{TargetKind: ledger.TargetFleet}))
	require.Equal(t, []ledger.KindTarget{kt(ledger.KindDiagnoseEndpoint, ledger.TargetEndpoint)},
		pairs(ledger.Filter{Family: ledger.FamilyDiagnose, TargetKind: ledger.TargetEndpoint}))
	require.Len(t, pairs(ledger.Filter{Family: ledger.FamilyCommands}), 4)
	for _, k := range pairs(ledger.Filter{TargetKind: ledger.TargetNode}) {
		require.Equal(t, ledger.TargetNode, k.TargetKind)
	}
	for _, f := range []ledger.Filter{{Family: "bogus"}, {Kind: "bogus"}, {TargetKind: "bogus"},
		{Family: ledger.FamilyNodes, Kind: ledger.KindFleetCommand}, {Family: ledger.FamilyCredentials, TargetKind: ledger.TargetNode}} {
		got := pairs(f)
		require.NotNil(t, got, "%+v", f)
		require.Empty(t, got, "%+v", f)
	}
	f := reg.Narrow(ledger.Filter{Family: ledger.FamilyNodes, TargetID: "n1", Before: 7, Limit: 3})
	require.Equal(t, ledger.FamilyNodes, f.Family)
	require.Equal(t, "n1", f.TargetID)
	require.EqualValues(t, 7, f.Before)
	require.Equal(t, 3, f.Limit)
}
