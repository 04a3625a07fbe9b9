package proxier

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/staleflows"
)

// A family's table that is not in the kernel yet (a node's first start) is
// written in pieces (nft.Editor.Piece), each its own transaction of whole
// Services, that the backend commits while the sync builds the next:
// building and the kernel's work overlap instead of adding up, and no batch
// holds the whole table. Until its piece is committed a Service is not in
// the table at all, as before the proxy started; no piece shows half of
// one. A table that is there is never written in pieces: a rewrite or a
// diff stays one transaction, so the data path never sees a mix of the old
// table and the new.

const (
	// tablePieces is how many pieces a table is cut into.
	tablePieces = 8
	// minPieceServices is the fewest Services a piece is worth its own
	// commit for; a smaller table is one transaction.
	minPieceServices = 1000
)

// piecewise is a table being written in pieces: a goroutine applies them
// in order, one at a time, while the sync builds the next.
type piecewise struct {
	every   int // Services per piece
	built   int // Services built since the last piece
	stopped bool
	sent    txSize // by every piece; the pieces are not kept
	pieces  int
	txs     chan *nft.Transaction
	done    chan struct{}
	err     error // the first piece the backend failed to apply; read after done
	resume  func()
}

// startPiecewise starts writing family f's table in pieces of every
// Services, beginning with the table's base (no Service), unless the table
// is too small to be worth it (nil). ctJob is the sync's conntrack job.
func (p *Proxier) startPiecewise(ctx context.Context, f nft.Family, fs *familyState, backend nft.Backend,
	services int, ctJob *staleflows.Job) *piecewise {
	every := max(p.pieceServices, (services+tablePieces-1)/tablePieces)
	if p.pieceServices <= 0 || services < 2*every {
		return nil
	}
	pw := &piecewise{every: every, txs: make(chan *nft.Transaction),
		done: make(chan struct{}), resume: func() {}}
	if p.deps.Monitor != nil {
		// The table's own commits come back as notifications, by the
		// thousand: the monitor leaves the group while the pieces go in
		// and counts them instead (see pauseMonitor).
		pw.resume = p.deps.Monitor.Pause()
	}
	p.committing(f, ctJob)
	go func() {
		defer close(pw.done)
		for tx := range pw.txs {
			if pw.err != nil {
				continue // a piece failed: the sync writes the table whole
			}
			if pw.err = backend.Apply(ctx, tx); pw.err == nil {
				p.committed(backend)
			}
		}
	}()
	pw.piece(f, fs)
	return pw
}

// serviceBuilt counts one more Service built, and hands out a piece after
// every pw.every of them.
func (pw *piecewise) serviceBuilt(f nft.Family, fs *familyState) {
	if pw.built++; pw.built >= pw.every {
		pw.piece(f, fs)
	}
}

// piece hands what the editor gained since the last piece to the
// goroutine, once it has applied the last one. The pick maps' chains are
// brought up to date first: a Service's elements jump to them.
func (pw *piecewise) piece(f nft.Family, fs *familyState) {
	pw.built = 0
	if pw.stopped {
		return
	}
	fs.picks = fs.slots.UpdatePicks(f, fs.editor, fs.picks)
	tx, ok := fs.editor.Piece()
	if !ok {
		pw.stopped = true
		return
	}
	if tx.Empty() {
		return // nothing since the last piece: no commit to count
	}
	pw.sent.add(sizeOf(tx))
	pw.pieces++
	pw.txs <- tx
}

// finish hands out the last piece and waits until every piece is applied.
// It returns what the pieces sent, and false when the table is
// not written: the pieces stopped (the editor could not go on with them)
// or the backend failed one. The sync then writes the whole table in one
// transaction, over what the pieces wrote.
func (pw *piecewise) finish(f nft.Family, fs *familyState) (txSize, bool) {
	pw.piece(f, fs)
	close(pw.txs)
	<-pw.done
	pw.resume()
	switch {
	case pw.err != nil:
		klog.ErrorS(pw.err, "A piece of the table failed; writing the table whole", "ipFamily", f.IPFamily())
		return txSize{}, false
	case pw.stopped:
		klog.V(2).InfoS("The table cannot be written in pieces; writing it whole", "ipFamily", f.IPFamily())
		return txSize{}, false
	}
	klog.V(2).InfoS("Wrote the table in pieces", "ipFamily", f.IPFamily(), "pieces", pw.pieces, "servicesPerPiece", pw.every)
	return pw.sent, true
}
