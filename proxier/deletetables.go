package proxier

import (
	"context"
	"errors"
	"fmt"

	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
)

// DeleteTables deletes nftproxy's tables (--cleanup).
func DeleteTables(ctx context.Context, backends map[nft.Family]nft.Backend) error {
	var errs []error
	for f, b := range backends {
		if err := b.Apply(ctx, &nft.Transaction{Family: f, Ops: []nft.Op{{Kind: nft.OpDeleteTable}}}); err != nil {
			metrics.NFTablesCleanupFailuresTotal.WithLabelValues(f.IPFamily()).Inc()
			errs = append(errs, fmt.Errorf("delete table %s %s: %w", f, nft.TableName, err))
		}
	}
	return errors.Join(errs...)
}
