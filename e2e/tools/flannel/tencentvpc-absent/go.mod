// Module vpc stands in for Tencent Cloud's VPC SDK, which the Go module proxy
// does not serve: flanneld links it for its tencent-vpc backend, which the
// CNI tests never select (they run the vxlan backend). Every call fails.
module github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc

go 1.26.0
